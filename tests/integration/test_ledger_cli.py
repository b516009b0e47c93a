"""`dpstream budget …` and `dpstream breaker …` against a real Redis, through the CLI entry point."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from dpstream.topology.periods import period_id, period_start
from dpstream.workers.cli import main
from dpstream.workers.commands import budget as budget_command
from dpstream.workers.ledger import ReleaseRequest, open_ledger
from dpstream.workers.ledger.keys import ScopeKeys
from dpstream.workers.ledger.testing import one_scope_topology

#: The fixed wall clock of these tests (06:00 UTC): nothing here depends on when the suite runs.
NOW = datetime(2026, 3, 10, 6, 0, tzinfo=UTC).timestamp()


@pytest.fixture(autouse=True)
def pinned_cli_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The CLI's ledger commands read the same fixed clock as the ledgers these tests charge through."""
    monkeypatch.setattr(budget_command, "clock", lambda: NOW)
    yield


def _charge(url: str, n: int) -> None:
    async def body() -> None:
        ledger = await open_ledger(url, one_scope_topology(), clock=lambda: NOW)
        now = NOW
        start = period_start(86_400, now)
        for i in range(n):
            await ledger.charge(
                ReleaseRequest(f"r{i}", "s", period_id(86_400, now), "m", start, start + 86_400, 0.125, b"{}")
            )
        await ledger.close()

    asyncio.run(body())


def test_status_json_shape(fresh_redis: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`budget status --json` reports cap, spent, ratio, state, releases and the period, as documented."""
    _charge(fresh_redis.url, 2)
    assert main(["budget", "status", "--redis", fresh_redis.url, "--json"]) == 0
    (s,) = json.loads(capsys.readouterr().out)["scopes"]
    assert (s["scope"], s["cap"], s["spent"], s["ratio"], s["state"]) == ("s", 1.0, 0.25, 0.25, "normal")
    assert s["releases"] == {"charged": 2, "refused": 0} and s["units"]["spent"] == 250_000_000_000
    assert set(s) >= {"epsilon_equiv", "reserve_left", "pool_left", "projected", "period", "breaker"}


def test_breaker_cli_and_audit(fresh_redis: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`breaker open` makes status OPEN with actor and reason; `budget audit` shows both actions."""
    _charge(fresh_redis.url, 1)
    assert (
        main(["breaker", "open", "--scope", "s", "--reason", "drill", "--actor", "ops", "--redis", fresh_redis.url])
        == 0
    )
    assert main(["budget", "status", "--scope", "s", "--redis", fresh_redis.url, "--json"]) == 0
    capsys.readouterr()
    assert main(["breaker", "close", "--scope", "s", "--reason", "drill over", "--redis", fresh_redis.url]) == 0
    assert main(["budget", "audit", "--scope", "s", "--since", "1h", "--redis", fresh_redis.url, "--json"]) == 0
    out = capsys.readouterr().out
    entries = json.loads(out[out.index("{") :])["entries"]
    kinds = [(e["kind"], e.get("reason")) for e in entries]
    assert ("breaker_open", "drill") in kinds and ("breaker_close", "drill over") in kinds


def test_reconcile_exit_code_reports_mismatch(fresh_redis: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`budget reconcile` exits 0 when spend matches the audit, 1 after the stored spend is tampered with."""
    _charge(fresh_redis.url, 3)
    assert main(["budget", "reconcile", "--redis", fresh_redis.url]) == 0
    with fresh_redis.client() as client:
        client.hincrby(ScopeKeys("s").period(period_id(86_400, NOW)), "spent", 5)
    assert main(["budget", "reconcile", "--redis", fresh_redis.url, "--json"]) == 1
    assert '"ok": false' in capsys.readouterr().out


def test_unknown_scope_is_a_one_line_config_error(fresh_redis: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Asking for a scope the ledger does not know exits 2 with one line naming it."""
    _charge(fresh_redis.url, 1)
    assert main(["budget", "status", "--scope", "nope", "--redis", fresh_redis.url]) == 2
    err = capsys.readouterr().err.strip()
    assert "'nope'" in err and len(err.splitlines()) == 1


def test_a_grant_with_nothing_left_exits_2_with_one_line(fresh_redis: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`budget grant` of the whole reserve works once; the next grant has nothing to widen: exit 2, one line."""
    _charge(fresh_redis.url, 1)
    grant = ["budget", "grant", "--scope", "s", "--reason", "report", "--actor", "ops", "--redis", fresh_redis.url]
    assert main([*grant, "--amount", "0.2"]) == 0
    assert "may now draw 0.2 of the reserve" in capsys.readouterr().out
    assert main([*grant, "--amount", "0.01"]) == 2
    err = capsys.readouterr().err.strip()
    assert "nothing left to grant" in err and "granted in full" in err and len(err.splitlines()) == 1


_TOPOLOGY = """\
version: 1
sources:
  src: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  s: {epsilon: 1.0, accounting: pure, period: 1d}
metrics:
  m: {source: src, budget: s, window: {tumbling: 1h}, aggregate: count, mechanism: laplace}
sinks: {releases: r, dead_letter: d}
"""


#: Times of day the first-period projection is checked at: either side of noon (where the old wall-clock
#: test turned red), near both ends of the day, and a minute into it.
_TIMES_OF_DAY = [(0, 1), (0, 30), (6, 0), (11, 59), (12, 1), (18, 0), (23, 59)]


@pytest.mark.parametrize(("hour", "minute"), _TIMES_OF_DAY, ids=[f"{h:02d}:{m:02d}" for h, m in _TIMES_OF_DAY])
def test_status_with_the_topology_projects_a_first_period_from_the_recorded_start(
    fresh_redis: Any,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    hour: int,
    minute: int,
) -> None:
    """With `--topology`, status reads the schedule start S the workers recorded and projects the first
    period's spend at its rate since S over what S left of the period (ratio x (end - S) / (now - S)), not at
    its rate since the period start, at every time of day (a pinned clock)."""
    from dpstream.topology.loader import load_topology

    path = tmp_path / "topology.yaml"
    path.write_text(_TOPOLOGY)
    topo = load_topology(str(path))
    now = datetime(2026, 3, 10, hour, minute, tzinfo=UTC).timestamp()
    monkeypatch.setattr(budget_command, "clock", lambda: now)
    pstart = period_start(86_400, now)
    start = pstart + int(now - pstart) // 2

    async def body() -> None:
        ledger = await open_ledger(fresh_redis.url, topo, clock=lambda: now)
        assert await ledger.version_schedule_start(topo.topology_version, start) == start
        await ledger.charge(ReleaseRequest("r0", "s", period_id(86_400, now), "m", pstart, pstart + 3600, 0.01, b"{}"))
        await ledger.close()

    asyncio.run(body())
    assert main(["budget", "status", "--topology", str(path), "--redis", fresh_redis.url, "--json"]) == 0
    (s,) = json.loads(capsys.readouterr().out)["scopes"]
    ratio, projected = s["ratio"], s["projected"]["ratio"]
    from_start = ratio * (pstart + 86_400 - start) / (now - start)
    from_period_start = ratio * 86_400 / (now - pstart)
    assert ratio == pytest.approx(0.01)
    assert projected == pytest.approx(from_start, rel=1e-9)
    assert from_start > from_period_start  # S after the period start: the two projections differ, at any hour
