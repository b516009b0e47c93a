"""`dpstream replay`: the whole core over a file — windows released once, bounded, deduped, fail-closed."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from dpstream.topology.loader import load_topology_text
from dpstream.workers.cli import main
from dpstream.workers.ledger import open_ledger
from dpstream.workers.release import ReleaseOutcome, release_id
from dpstream.workers.runtime.replay import replay_lines

_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts, allowed_lateness: 5s}
budgets:
  big: {epsilon: 200.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  views:
    source: clicks
    budget: big
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    contribution: {max_per_key: 5}
    mechanism: gaussian
  pages:
    source: clicks
    budget: big
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    group_by: page
    keys: [a, b, c]
    contribution: {max_keys: 2, max_per_key: 1}
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""

_T0 = 1_796_000_400  # minute-aligned


def _bound(rec: dict) -> float:
    """|noise| bound for one discrete Gaussian value with false-failure rate ≈ 2.6e-12: 7σ."""
    assert rec["mechanism"] == "discrete_gaussian"
    return 7.0 * float(rec["noise"]["stddev"])


@pytest.fixture(scope="module")
def topo():
    return load_topology_text(_YAML)


def _events() -> list[bytes]:
    ev = []
    for i in range(20):  # window 0: 20 light users, one event each on page a
        ev.append({"user_id": f"u{i}", "ts": _T0 + i, "page": "a"})
    for i in range(10_000):  # window 0: one heavy user
        ev.append({"user_id": "heavy", "ts": _T0 + (i % 60), "page": "abc"[i % 3]})
    for i in range(7):  # window 2 (window 1 stays empty)
        ev.append({"user_id": f"v{i}", "ts": _T0 + 125, "page": "b"})
    ev.sort(key=lambda e: e["ts"])
    return [json.dumps(e).encode() for e in ev] + [b"not json", b'{"ts": 1}']


async def _replay(topo, ledger, partitions=1):
    published: list[tuple[bytes, bytes]] = []

    async def publish(value: bytes, key: bytes) -> None:
        published.append((value, key))

    summary = await replay_lines(topo, _events(), ledger, publish, start=_T0, end=_T0 + 180, partitions=partitions)
    return summary, published


@pytest.mark.parametrize("partitions", [1, 3])
def test_every_window_released_once_bounded_and_near_truth(topo, partitions):
    """Windows 0, 1 (empty) and 2 of both metrics are released once; values sit within 7σ of the bounded truth."""

    async def go():
        ledger = await open_ledger("memory", topo)
        return await _replay(topo, ledger, partitions)

    summary, published = asyncio.run(go())
    recs = {(r["metric"], r["window"]["start_epoch"]): r for r in (json.loads(v) for v, _ in published)}
    assert len(recs) == len(published) == 6
    truth = {
        ("views", _T0): 20 + 5,  # the heavy unit adds max_per_key = 5
        ("views", _T0 + 60): 0,
        ("views", _T0 + 120): 7,
    }
    for (metric, start), want in truth.items():
        rec = recs[(metric, start)]
        assert rec["release_id"] == release_id(topo.topology_version, metric, start, start + 60)
        assert abs(rec["values"][""] - want) <= _bound(rec)
        assert "complete" not in rec  # nothing data-dependent besides the noisy values
    assert abs(recs[("views", _T0)]["values"][""] - 10_020) > _bound(recs[("views", _T0)])  # unbounded is far off
    pages0 = recs[("pages", _T0)]
    assert set(pages0["values"]) == {"a", "b", "c"}
    heavy_total = sum(pages0["values"].values())
    assert abs(heavy_total - (20 + 2)) <= 3 * _bound(pages0)  # heavy unit: at most max_keys × max_per_key
    assert set(recs[("pages", _T0 + 60)]["values"]) == {"a", "b", "c"}  # empty window, public keys
    assert summary.events.invalid == {"not_json": 1, "missing_unit": 1}
    assert summary.releases.snapshot()["published"] == 6


def test_replaying_twice_on_one_ledger_returns_identical_bytes(topo):
    """The second replay is all DUPLICATE and publishes byte-identical records (no second noisy value)."""

    async def go():
        ledger = await open_ledger("memory", topo)
        first = await _replay(topo, ledger)
        second = await _replay(topo, ledger)
        return first, second

    (s1, p1), (s2, p2) = asyncio.run(go())
    assert p1 == p2
    assert {r.outcome for r in s2.results} == {ReleaseOutcome.DUPLICATE}
    assert s2.releases.snapshot()["duplicate"] == len(p1) == 6


def test_refused_releases_publish_nothing(topo):
    """With the scope's breaker open every window is refused (refused_breaker) with a reason and nothing is
    published."""

    async def go():
        ledger = await open_ledger("memory", topo)
        await ledger.open_breaker("big", "maintenance", "pytest")
        return await _replay(topo, ledger)

    summary, published = asyncio.run(go())
    assert published == []
    assert summary.releases.snapshot()["refused_breaker"] == 6
    assert all(r.reason for r in summary.results)


def test_cli_writes_json_lines_and_a_summary_without_raw_values(topo, tmp_path, capsys):
    """`dpstream replay` writes one record per line to --out and counts dead letters by reason on stderr;
    its in-process ledger's records say `"ledger": null` and stderr says they were charged to no ledger."""
    topo_file = tmp_path / "t.yaml"
    topo_file.write_text(_YAML)
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join(_events()[-40:] + [b'{"user_id": "secret-42", "ts": "soon"}']) + b"\n")
    out = tmp_path / "rel.jsonl"
    span = ["--from", str(_T0), "--to", str(_T0 + 180)]
    assert main(["replay", str(topo_file), str(events), "--out", str(out), "--partitions", "2", *span]) == 0
    lines = out.read_bytes().splitlines()
    assert lines and all(json.loads(line)["release_id"] for line in lines)
    assert all(json.loads(line)["ledger"] is None for line in lines)
    err = capsys.readouterr().err
    assert 'records carry "ledger": null: charged to no ledger' in err
    assert "invalid:bad_timestamp=1" in err and "invalid:not_json=1" in err
    assert "secret-42" not in err and "soon" not in err
    (events_line,) = [line for line in err.splitlines() if "accepted=" in line]
    assert "curator-only" in events_line  # exact input counts say they are not for publication


def test_cli_names_a_missing_events_file(tmp_path, capsys):
    """A missing events file is a one-line user error (exit 2)."""
    topo_file = tmp_path / "t.yaml"
    topo_file.write_text(_YAML)
    span = ["--from", str(_T0), "--to", str(_T0 + 180)]
    assert main(["replay", str(topo_file), str(tmp_path / "nope.jsonl"), *span]) == 2
    assert "cannot read events file" in capsys.readouterr().err
    assert math.isfinite(1.0)


def test_a_full_day_releases_every_window_including_the_empty_ones_at_its_start(topo, tmp_path, capsys):
    """`replay --from D --to D+1`: 1,440 windows per metric, the first ones before any event included;
    an event outside the day is dead-lettered `out_of_range`, never a release."""
    day = _T0 - _T0 % 86_400
    topo_file = tmp_path / "t.yaml"
    topo_file.write_text(_YAML)
    events = tmp_path / "events.jsonl"
    lines = [{"user_id": f"u{i}", "ts": day + 43_200 + i, "page": "a"} for i in range(30)]
    lines.append({"user_id": "early", "ts": day - 5})
    events.write_text("\n".join(json.dumps(e) for e in lines) + "\n")
    out = tmp_path / "rel.jsonl"
    code = main(
        ["replay", str(topo_file), str(events), "--out", str(out), "--from", str(day), "--to", str(day + 86_400)]
    )
    assert code == 0
    recs = [json.loads(line) for line in out.read_bytes().splitlines()]
    starts = {m: sorted(r["window"]["start_epoch"] for r in recs if r["metric"] == m) for m in ("views", "pages")}
    assert starts["views"] == starts["pages"] == list(range(day, day + 86_400, 60))
    assert "invalid:out_of_range=1" in capsys.readouterr().err


def test_without_from_or_to_the_replay_is_refused_naming_both_flags(topo, tmp_path, capsys):
    """No --from, no --to, or only one of them: one line naming both flags (exit 2), nothing released;
    the schedule is never taken from the events."""
    day = _T0 - _T0 % 86_400
    topo_file = tmp_path / "t.yaml"
    topo_file.write_text(_YAML)
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"user_id": "a", "ts": day + 100}) + "\n")
    out = tmp_path / "rel.jsonl"
    for flags in ([], ["--from", str(day)], ["--to", str(day + 86_400)]):
        assert main(["replay", str(topo_file), str(events), "--out", str(out), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "--from and --to are both required" in err, err
        assert not out.exists() or out.read_bytes() == b""


def test_from_to_must_be_utc_and_ordered(topo, tmp_path, capsys):
    """A time without offset, or --to before --from, is a one-line user error (exit 2)."""
    topo_file = tmp_path / "t.yaml"
    topo_file.write_text(_YAML)
    events = tmp_path / "events.jsonl"
    events.write_text("")
    assert main(["replay", str(topo_file), str(events), "--from", "2026-11-30T00:00:00", "--to", "2026-12-01"]) == 2
    assert "no UTC offset" in capsys.readouterr().err
    assert main(["replay", str(topo_file), str(events), "--from", "2026-12-01", "--to", "2026-11-30"]) == 2
    assert "--to must be after --from" in capsys.readouterr().err


def test_a_replay_from_mid_period_spends_that_periods_pool_on_the_windows_it_releases(tmp_path):
    """`replay --from 06:30 --to 24:00`: the daily window (started at 00:00) is not in the schedule, so the
    ledger prices from --from and the 17 hourly windows spend the whole pool (1 − reserve of the cap),
    not only their share of a whole day's plan."""
    day = _T0 - _T0 % 86_400
    topo_file = tmp_path / "t.yaml"
    topo_file.write_text(
        _YAML.replace("window: {tumbling: 1m}", "window: {tumbling: 1h}", 1)
        .replace("weight: 1\n    window: {tumbling: 1m}", "weight: 3\n    window: {tumbling: 1d}", 1)
        .replace("period: 1d}", "period: 1d, reserve: 0.2}")
    )
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"user_id": "a", "ts": day + 43_200, "page": "a"}) + "\n")
    out = tmp_path / "rel.jsonl"
    span = ["--from", str(day + 6 * 3600 + 1800), "--to", str(day + 86_400)]
    assert main(["replay", str(topo_file), str(events), "--out", str(out), *span]) == 0
    recs = [json.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted((r["metric"], r["window"]["start_epoch"] - day) for r in recs) == [
        ("views", h * 3600) for h in range(7, 24)
    ]
    costs = [r["cost"]["rho"] for r in recs]
    assert max(costs) - min(costs) <= 1e-11  # an even grant (to a few 1e-12 units of rounding)
    assert math.isclose(max(r["budget"]["ratio_after"] for r in recs), 0.8, abs_tol=1e-6)
