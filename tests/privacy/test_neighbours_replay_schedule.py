"""`dpstream replay` as a user runs it: D and D′ (D plus one adversarial unit whose only event is two
days before everyone else's) get the same set of releases, because the schedule comes from
--from/--to only; without them the command refuses both streams alike instead of deriving a range."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.privacy import _neighbours as nb

DAY = 86_400
TOPOLOGY = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts}
budgets:
  daily: {epsilon: 1.0, delta: 1.0e-6, period: 1d}
metrics:
  hourly:
    source: clicks
    budget: daily
    window: {tumbling: 1h}
    aggregate: count
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""


def _streams() -> tuple[list[bytes], list[bytes], int]:
    """D (one day of ordinary events), D′ (D plus an adversary's event two days earlier) and the day."""
    day = nb.T0 - nb.T0 % DAY
    d = nb.to_lines({"user_id": f"u{i}", "ts": day + 3600 + 97 * i} for i in range(200))
    adversary = nb.to_lines([{"user_id": "adversary", "ts": day - 2 * DAY + 10}])
    return d, nb.interleave(d, [(57, adversary[0])]), day


def test_an_event_two_days_early_adds_no_release(tmp_path: Path) -> None:
    """Over the same --from/--to, D and D′ have the same release_ids: the 24 hours of the day."""
    topology = tmp_path / "t.yaml"
    topology.write_text(TOPOLOGY)
    d, d_prime, day = _streams()
    flags = ["--from", str(day), "--to", str(day + DAY)]
    code_d, base = nb.run_replay_cli(str(topology), d, flags, tmp_path)
    code_n, neighbour = nb.run_replay_cli(str(topology), d_prime, flags, tmp_path)
    assert code_d == code_n == 0
    assert set(base) == set(neighbour) and len(base) == 24
    assert nb.field_differences(base, neighbour) == []


def test_without_from_to_neither_stream_gets_a_schedule_from_its_events(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no --from/--to, D and D′ are answered alike (refused, exit 2, nothing released): a range
    derived from the events would give D 24 releases and D′ 72 (three days)."""
    topology = tmp_path / "t.yaml"
    topology.write_text(TOPOLOGY)
    d, d_prime, _ = _streams()
    code_d, base = nb.run_replay_cli(str(topology), d, [], tmp_path)
    code_n, neighbour = nb.run_replay_cli(str(topology), d_prime, [], tmp_path)
    assert (code_d, sorted(base)) == (code_n, sorted(neighbour)), (len(base), len(neighbour))
    assert code_d == 2 and base == {}
    assert "--from and --to are both required" in capsys.readouterr().err
