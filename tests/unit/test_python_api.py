"""`import dpstream`: the README's example runs, the API releases what `dpstream replay` releases, costs are typed."""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

import dpstream
from dpstream.topology.accounting import epsilon_equivalent
from dpstream.workers.cli import main

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "topology" / "examples" / "web-analytics.yaml"
PURE = ROOT / "topology" / "examples" / "seed-example.yaml"

FUTURE = 4_102_444_800
"""2100-01-01T00:00:00Z. `dpstream replay`'s in-process ledger reads the wall clock and refuses windows
past its idempotency horizon (35 days); windows in 2100 are inside it on any date this test runs."""


def _readme_example() -> str:
    """The one ```python block of README.md's "From Python" section, verbatim."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)
    assert len(blocks) == 1, "the From Python section has exactly one python block"
    return blocks[0]


def _web_events(start: int) -> list[bytes]:
    """An hour of clicks from 40 users (JSON lines), one line that is not JSON, one event out of range."""
    lines = [
        json.dumps(
            {
                "user_id": f"u{i % 40}",
                "ts": start + 5 * i,
                "page": ["home", "search", "cart"][i % 3],
                "basket_eur": float(i % 90),
                "session_s": 10 * (i % 7),
                "referrer": ["news", "ads"][i % 2],
            }
        ).encode()
        for i in range(720)
    ]
    lines.insert(100, b"{not json")
    lines.append(json.dumps({"user_id": "late", "ts": start + 7200, "page": "home"}).encode())
    return lines


def test_readme_example_runs_and_releases_every_window_of_its_schedule(monkeypatch, capsys):
    """The README's "From Python" block runs verbatim; it releases each minute of its hour and its status adds up."""
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(_readme_example(), "README.md[From Python]", "exec"), namespace)
    out = capsys.readouterr().out
    replay, status = namespace["replay"], namespace["status"]
    assert isinstance(replay, dpstream.Replay) and isinstance(status, dpstream.BudgetStatus)
    start = datetime(2026, 11, 30, tzinfo=UTC)
    minutes = [r.window_start for r in replay if r.metric == "page_views"]
    assert minutes == [start + timedelta(minutes=m) for m in range(60)]  # empty or not, none skipped
    topology = dpstream.load_topology(WEB)
    assert {r.metric for r in replay} == set(topology.metrics)
    assert replay.release_counts["published"] == len(replay) == status.charged
    assert isinstance(status.spent, dpstream.Rho) and isinstance(status.cap, dpstream.Rho)
    assert status.spent.value == pytest.approx(math.fsum(r.cost.value for r in replay), rel=1e-9)
    assert status.period_id == "2026-11-30"
    assert (
        out.splitlines()[0] == f"{status.cap} {dpstream.plan(topology).scopes['web-daily'].per_release['page_views']}"
    )


def test_the_module_docstring_example_runs_and_prints_what_its_comments_say(monkeypatch, capsys):
    """help(dpstream)'s example runs as written and prints the cap and the hour's spend its comments name."""
    monkeypatch.chdir(ROOT)
    doc = dpstream.__doc__ or ""
    example = textwrap.dedent(doc.split("\n\n", 1)[1].split("What it offers:", 1)[0])
    exec(compile(example, "dpstream.__doc__", "exec"), {"__name__": "doc_example"})
    lines = capsys.readouterr().out.splitlines()
    commented = re.findall(r"# (Rho\([0-9.e-]+\))", example)
    assert [lines[0], lines[-1]] == commented
    # the cap, the spend and between them every window of the hour: 60 one-minute, 56 five-minute hopping
    # (every minute, ending by 01:00), 12 five-minute, 4 quarter-hour and 1 hourly window
    assert len(lines) == 2 + 60 + 56 + 12 + 4 + 1


@pytest.mark.parametrize("partitions", [1, 3])
def test_api_replay_releases_what_the_cli_releases(tmp_path, capsys, partitions):
    """Same topology and events: the API's records have the CLI's release ids (in its order), windows and costs."""
    events = tmp_path / "events.jsonl"
    lines = _web_events(FUTURE)
    events.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "releases.jsonl"
    span = ["--from", str(FUTURE), "--to", str(FUTURE + 3600)]
    argv = ["replay", str(WEB), str(events), "--out", str(out), "--partitions", str(partitions), *span]
    assert main(argv) == 0
    capsys.readouterr()
    cli = [dpstream.Release.of(line) for line in out.read_bytes().splitlines()]
    assert len(cli) > 100

    # dicts where the line is JSON, the raw bytes where it is not
    as_events = [json.loads(line) if line.startswith(b'{"') else line for line in lines]
    start, end = datetime.fromtimestamp(FUTURE, tz=UTC), FUTURE + 3600
    fresh = dpstream.replay(WEB, as_events, start=start, end=end, partitions=partitions)
    topology = dpstream.load_topology(WEB)
    with dpstream.open_ledger("memory", topology) as ledger:
        shared = dpstream.replay(topology, iter(lines), start=FUTURE, end=end, ledger=ledger, partitions=partitions)

    def key(r: dpstream.Release) -> tuple[object, ...]:
        return r.release_id, r.metric, r.window_start, r.window_end, r.cost, r.published_at

    assert [key(r) for r in fresh] == [key(r) for r in shared] == [key(r) for r in cli]
    assert fresh.ledger_id is None and fresh.release_counts["published"] == len(cli)
    assert fresh.curator_event_counts["invalid:not_json"] == 1
    assert fresh.curator_event_counts["invalid:out_of_range"] == 1


def test_help_lists_every_public_name(tmp_path):
    """`python -c "import dpstream; help(dpstream)"` shows the module's guide and each name of `__all__`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PAGER", "MANPAGER")}
    result = subprocess.run(
        [sys.executable, "-c", "import dpstream; help(dpstream)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "dpstream from Python" in result.stdout
    assert "replay(topology, events, start=, end=)" in result.stdout
    shown = set(re.findall(r"\w+", result.stdout))
    assert set(dpstream.__all__) <= shown, set(dpstream.__all__) - shown
    assert {"replay", "replay_async", "plan", "validate", "open_ledger", "Rho", "Epsilon"} <= set(dpstream.__all__)


def test_dpstream_workers_api_is_not_a_second_copy():
    """The API folder loads only as `dpstream`; importing it under its folder's name is refused."""
    with pytest.raises(ImportError):
        importlib.import_module("dpstream.workers.api")
    assert dpstream.__name__ == "dpstream" and Path(dpstream.__file__).parent == ROOT / "workers" / "api"


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf, -math.inf, True, "0.5", None])
@pytest.mark.parametrize("kind", [dpstream.Rho, dpstream.Epsilon])
def test_costs_refuse_what_is_not_a_finite_non_negative_number(kind, bad):
    """Rho and Epsilon reject negative, NaN, infinite and non-numeric values with a one-line ConfigError."""
    with pytest.raises(dpstream.ConfigError, match=rf"^{kind.__name__}\(.*\): .*e\.g\. {kind.__name__}\(0\.5\)$"):
        kind(bad)


def test_costs_are_readable_ordered_and_never_mix():
    """Costs print as Rho(…)/Epsilon(…), add and compare within one currency, and a ρ never meets an ε."""
    assert repr(dpstream.Rho(0.004) + dpstream.Rho(0.001)) == "Rho(0.005)"
    assert repr(dpstream.Epsilon(1)) == "Epsilon(1)"
    assert dpstream.Epsilon(0.5) < dpstream.Epsilon(1.0) and float(dpstream.Rho(0.25)) == 0.25
    assert dpstream.Rho(0.0).value == 0  # nothing spent yet
    with pytest.raises(TypeError):
        dpstream.Rho(0.1) + dpstream.Epsilon(0.1)  # type: ignore[operator]  # the point: ρ and ε do not add
    with pytest.raises(TypeError):
        assert dpstream.Rho(0.1) < dpstream.Epsilon(0.2)  # type: ignore[operator]  # nor compare
    assert dpstream.Rho(0.01).epsilon_at(1e-6) == epsilon_equivalent(True, 0.01, 1e-6)
    with pytest.raises(AttributeError):
        dpstream.Rho(0.1).value = 0.2  # type: ignore[misc]  # frozen


def test_a_pure_scope_plans_and_charges_in_epsilon():
    """In a pure scope, the plan's cap and per-release costs, the records' costs and the status are Epsilon."""
    planned = dpstream.plan(PURE)
    scope = planned.scopes["risk-features"]
    assert scope.cap == dpstream.Epsilon(2.0) and scope.accounting == "pure"
    assert all(isinstance(c, dpstream.Epsilon) for c in scope.per_release.values())
    assert planned.to_json()["scopes"][0]["cap"] == scope.cap.value
    assert str(planned).strip()
    topology = dpstream.load_topology(PURE)
    day = datetime(2100, 1, 1, tzinfo=UTC)
    # the clock inside the replayed day: at its end (the next midnight) the status would be the next day's
    with dpstream.open_ledger("memory", topology, now=day + timedelta(hours=23)) as ledger:
        replay = dpstream.replay(topology, [], start=day, end=day + timedelta(days=1), ledger=ledger)
        status = ledger.status("risk-features")
    assert len(replay) == len(topology.metrics)  # one daily window each, released with no events at all
    assert all(isinstance(r.cost, dpstream.Epsilon) for r in replay)
    assert isinstance(status.spent, dpstream.Epsilon) and status.charged == len(replay)
    assert status.to_json()["spent"] == status.spent.value and status.to_json()["scope"] == "risk-features"


def test_validate_returns_warnings_and_a_mistake_is_one_line(tmp_path):
    """validate() gives the topology and the warnings `dpstream validate` prints; a broken file raises ConfigError."""
    checked = dpstream.validate(WEB)
    assert isinstance(checked.topology, dpstream.Topology)
    assert checked.warnings and all(isinstance(w, dpstream.ConfigWarning) for w in checked.warnings)
    broken = ROOT / "tests" / "topologies" / "broken" / "epsilon_negative.yaml"
    with pytest.raises(dpstream.ConfigError, match=r"^.*epsilon_negative\.yaml:\d+: ") as caught:
        dpstream.load_topology(broken)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start": datetime(2100, 1, 1), "end": FUTURE + 60}, r"^start 2100-01-01T00:00:00: no time zone"),
        ({"start": FUTURE, "end": "2100-01-02"}, r"^end '2100-01-02': not a time"),
        ({"start": True, "end": FUTURE + 60}, r"^start True: not a time"),
        ({"start": FUTURE, "end": FUTURE}, r"--to must be after --from"),
        ({"start": FUTURE, "end": FUTURE + 60, "partitions": 0}, r"^partitions 0: need a whole number >= 1"),
    ],
)
def test_replay_refuses_a_schedule_it_cannot_use(kwargs, message):
    """start/end must be public times (epoch seconds or aware datetimes) with end after start; one-line errors."""
    with pytest.raises(dpstream.ConfigError, match=message):
        dpstream.replay(WEB, [], **kwargs)


def test_replay_has_no_default_schedule():
    """start and end are required: the schedule is never taken from the events."""
    with pytest.raises(TypeError, match="start"):
        dpstream.replay(WEB, [{"user_id": "u", "ts": FUTURE}])  # type: ignore[call-arg]  # the point: no default


def test_an_item_that_is_not_an_event_is_named_by_its_index():
    """A list item that is neither a dict nor JSON bytes stops the replay with its index and type, not its value."""
    with pytest.raises(dpstream.ConfigError, match=r"^events\[1\]: a int, not an event; give a dict"):
        dpstream.replay(WEB, [{"user_id": "u"}, 7], start=FUTURE, end=FUTURE + 60)


def test_a_ledger_must_be_opened_with_the_replayed_topology():
    """A ledger opened without the topology (status only) or with another one cannot price this replay."""
    with dpstream.open_ledger("memory") as ledger, pytest.raises(dpstream.ConfigError, match="opened without this"):
        dpstream.replay(WEB, [], start=FUTURE, end=FUTURE + 60, ledger=ledger)
    with dpstream.open_ledger("memory", dpstream.load_topology(PURE)) as ledger:
        with pytest.raises(dpstream.ConfigError, match="open it with dpstream.open_ledger"):
            dpstream.replay(WEB, [], start=FUTURE, end=FUTURE + 60, ledger=ledger)
        assert ledger.scopes() == ["risk-features"]


def test_sync_replay_refuses_an_async_ledger():
    """An async ledger belongs to its own event loop: the sync replay refuses it and names replay_async."""
    from dpstream.workers.ledger import open_ledger as open_core

    core = asyncio.run(open_core("memory", dpstream.load_topology(WEB)))
    with pytest.raises(dpstream.ConfigError, match=r"^replay: ledger MemoryLedger: .*replay_async"):
        dpstream.replay(WEB, [], start=FUTURE, end=FUTURE + 60, ledger=core)  # type: ignore[arg-type]  # the point


def test_now_fixes_only_the_in_process_ledger_clock():
    """`now=` is refused for a Redis ledger (one line, before any connection) and needs a time zone."""
    with pytest.raises(dpstream.ConfigError, match=r"now= fixes the in-process ledger's clock only"):
        dpstream.open_ledger("redis://127.0.0.1:1/0", now=FUTURE)
    with pytest.raises(dpstream.ConfigError, match=r"^now .*: no time zone"):
        dpstream.open_ledger("memory", now=datetime(2100, 1, 1))
    tz = timezone(timedelta(hours=2))
    with dpstream.open_ledger("memory", dpstream.load_topology(PURE), now=datetime(2100, 1, 1, 1, tzinfo=tz)) as ledger:
        assert ledger.status("risk-features").period_id == "2099-12-31"  # 23:00 UTC the day before


def test_sync_calls_work_inside_a_running_event_loop():
    """In a notebook an event loop already runs: replay() still works there, and replay_async() gives the same ids."""

    async def cell() -> tuple[list[str], list[str]]:
        sync = dpstream.replay(WEB, _web_events(FUTURE), start=FUTURE, end=FUTURE + 600)
        awaited = await dpstream.replay_async(WEB, _web_events(FUTURE), start=FUTURE, end=FUTURE + 600)
        return [r.release_id for r in sync], [r.release_id for r in awaited]

    sync_ids, async_ids = asyncio.run(cell())
    assert sync_ids and sync_ids == async_ids


def test_a_closed_ledger_says_so():
    """A call on a closed ledger is a one-line ConfigError; closing twice is harmless."""
    ledger = dpstream.open_ledger("memory", dpstream.load_topology(PURE))
    ledger.close()
    ledger.close()
    with pytest.raises(dpstream.ConfigError, match="this ledger is closed"):
        ledger.status("risk-features")
