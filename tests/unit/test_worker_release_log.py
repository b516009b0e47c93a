"""What a working worker logs: one INFO line per published release (the demo's row, from the public
record), and Faust's own chatter held at WARNING by the worker's logging setup."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator

import faust
import pytest

from dpstream.topology.errors import ConfigError
from dpstream.workers.commands.worker import LIBRARY_LOGGERS, worker_logging
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology
from dpstream.workers.pipeline.merger import MergedWindow
from dpstream.workers.release import Releaser
from dpstream.workers.release.display import release_line
from dpstream.workers.runtime.releases import ReleaseSide
from dpstream.workers.runtime.settings import RuntimeSettings

HOUR = 3_600
T0 = 1_796_000_000
P0 = (T0 // 86_400) * 86_400
TRUE_COUNT = 48_611_317
"""The window's true count: nothing but the published record may reach the log."""

_RECORD = {
    "metric": "page_views",
    "aggregate": "count",
    "window": {"start_epoch": 1_795_996_800, "end_epoch": 1_795_996_860},  # 2026-11-30 00:00–00:01 UTC
    "budget": {"scope": "web-daily", "period": "2026-11-30", "ratio_after": 0.000208},
    "values": {"": 1234.0},
    "ci": {"level": 0.95, "half_width": 56.0},
}


@pytest.fixture
def new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A local time zone far from UTC: the line must still show the window in UTC."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_the_log_line_of_a_record_is_one_line_with_metric_utc_window_ratio_and_ci(new_york: None) -> None:
    """metric, window in UTC (labelled), the budget's ratio after, the noisy value ± its 95 % CI."""
    line = release_line(_RECORD)
    assert line == "page_views       00:00:00–00:01:00 UTC budget  0.02 %  1,234 ±56"
    assert release_line(_RECORD, "republished") == line + "   [republished]"


def test_grouped_and_top_k_records_are_one_line_too() -> None:
    """A grouped record: ±half then one 'key value' per key; a top-k one: its ranking; never a second row."""
    grouped = {**_RECORD, "values": {"cart": 450.0, "home": -1570.0}, "ci": {"half_width": 5353.0}}
    top = {**_RECORD, "metric": "top_referrers", "keys": ["news", "search"], "values": {}, "ci": None}
    assert (
        release_line(grouped) == "page_views       00:00:00–00:01:00 UTC budget  0.02 %  ±5,353   cart 450  home -1,570"
    )
    assert release_line(top) == "top_referrers    00:00:00–00:01:00 UTC budget  0.02 %  top: news, search"
    assert release_line({**_RECORD, "charge_only": True}) is None


def test_keys_from_the_data_are_counted_not_named_in_a_log_line() -> None:
    """A metric whose keys come from the data (partition selection, top-k): the worker's line says how many
    keys were released, never which (DESIGN §1: no log line carries a data-derived key, released or not)."""
    grouped = {**_RECORD, "values": {"canary-key": 2671.0, "home": 40.0}, "ci": {"half_width": 634.0}}
    top = {**_RECORD, "metric": "top_referrers", "keys": ["canary-key"], "values": {}, "ci": None}
    head = "00:00:00–00:01:00 UTC budget  0.02 %  "
    assert (
        release_line(grouped, hide_keys=True)
        == f"page_views       {head}2 keys released (named on the releases topic only)"
    )
    assert (
        release_line(top, hide_keys=True) == f"top_referrers    {head}1 key released (named on the releases topic only)"
    )
    assert release_line({**top, "keys": []}, hide_keys=True).endswith(
        "0 keys released (named on the releases topic only)"
    )
    assert release_line(_RECORD, hide_keys=True) == release_line(_RECORD)  # ungrouped: nothing to hide


class _Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []

    async def __call__(self, value: bytes, key: bytes) -> None:
        self.sent.append((value, key))


def _published_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "dpstream.workers.runtime.releases" and r.levelno == logging.INFO
    ]


def test_the_release_side_logs_each_published_release_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A release published, then its stored bytes again (a retry: duplicate) and through the sweeper:
    one INFO line, from the published record, with no true value; a release first seen by the sweeper
    here (another owner charged it) logs once, marked republished."""
    caplog.set_level(logging.INFO, logger="dpstream")

    async def body() -> None:
        topo = one_scope_topology(metrics=(("m", 1.0, HOUR, HOUR, False),))
        app = faust.App("test-release-log", broker="kafka://127.0.0.1:1", web_enabled=False)
        side = ReleaseSide(app, topo, RuntimeSettings(bootstrap="127.0.0.1:1", redis_url="memory"), {"m": 1})
        ledger = await open_ledger("memory", topo, clock=ManualClock(T0))
        side._releaser = Releaser(topo, ledger)
        sink = _Sink()
        monkeypatch.setattr(side, "_publish", sink)  # the releases topic (no broker in a unit test)
        window = MergedWindow("m", P0 + 5 * HOUR, P0 + 6 * HOUR, {"": TRUE_COUNT})
        for _ in range(2):  # the second run finds the stored record: a duplicate, same bytes
            side._finished(window, await side._release_now(window), None)
        value, key = sink.sent[0]
        await side._publish_swept(value, key)
        assert len(sink.sent) == 3 and {v for v, _ in sink.sent} == {value}

        lines = _published_lines(caplog)
        assert lines == ["published " + release_line(json.loads(value))]
        assert " UTC budget " in lines[0] and "\n" not in lines[0]
        # no true value: everything dpstream logged is that line, a function of the public record alone
        # (the noisy value itself equals the true count with probability ~2 %, so the text is not searched)
        assert [r.getMessage() for r in caplog.records if r.name.startswith("dpstream")] == lines

        caplog.clear()
        other = {**json.loads(value), "release_id": "another-owner"}
        await side._publish_swept(json.dumps(other).encode(), b"another-owner")
        assert _published_lines(caplog) == ["published " + release_line(other, "republished")]

    asyncio.run(body())


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """Faust's setup rewrites the root logger: put it and the touched loggers back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    names = ("dpstream", *LIBRARY_LOGGERS)
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, saved in levels.items():
        logging.getLogger(name).setLevel(saved)


def _faust_sets_up(given: str | None) -> None:
    """Run Faust's own logging setup as `run_worker` does, with the worker's level and config."""
    handler_level, config = worker_logging(given)
    app = faust.App("test-worker-logging", broker="kafka://127.0.0.1:1", web_enabled=False)
    app.conf.logging_config = config
    worker = faust.Worker(app, loglevel=handler_level, quiet=True, redirect_stdouts=False)
    worker._setup_logging()


@pytest.mark.usefixtures("restored_logging")
def test_by_default_dpstream_logs_info_and_faust_aiokafka_mode_stay_at_warning() -> None:
    """Without --loglevel: release lines (dpstream INFO) reach the handler; Faust's, mode's, aiokafka's
    and kafka's INFO do not; neither does an unnamed library's (the root is at WARNING)."""
    _faust_sets_up(None)
    assert logging.getLogger("dpstream.workers.runtime.releases").isEnabledFor(logging.INFO)
    assert all(h.level <= logging.INFO for h in logging.getLogger().handlers)
    for name in ("faust", "faust.worker", "aiokafka", "aiokafka.consumer.group_coordinator", "mode", "kafka", "x"):
        assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING, name


@pytest.mark.usefixtures("restored_logging")
def test_faust_lifecycle_lines_of_a_dpstream_service_are_dropped_below_warning() -> None:
    """A mode Service defined in dpstream logs 'Starting...' through its module's (dpstream) logger:
    the worker's handler drops it by default, keeps dpstream's own INFO and the service's warnings."""
    import mode

    _faust_sets_up(None)
    logger = logging.getLogger("dpstream.workers.runtime.app")
    records: list[logging.LogRecord] = []
    keep = logging.Handler()
    keep.emit = records.append  # type: ignore[method-assign]  # collect the records, as created
    logger.addHandler(keep)

    class _Service(mode.Service):
        pass

    _Service.logger = logger
    try:
        service = _Service()
        service._log_mundane("Starting...")
        service.log.warning("a Faust warning")
        logger.info("published views ...")
    finally:
        logger.removeHandler(keep)
    (console,) = logging.getLogger().handlers
    assert [bool(console.filter(r)) for r in records] == [False, True, True]


@pytest.mark.usefixtures("restored_logging")
def test_loglevel_debug_opens_everything_and_warning_quiets_dpstream_too() -> None:
    """--loglevel DEBUG: every logger at DEBUG; --loglevel WARNING: dpstream's release lines are off."""
    _faust_sets_up("DEBUG")
    for name in ("dpstream.worker", "faust", "aiokafka", "mode"):
        assert logging.getLogger(name).isEnabledFor(logging.DEBUG), name
    _faust_sets_up("warning")
    assert not logging.getLogger("dpstream.workers.runtime.releases").isEnabledFor(logging.INFO)
    assert logging.getLogger("faust").getEffectiveLevel() == logging.WARNING


def test_an_unknown_loglevel_is_one_line() -> None:
    """A level logging does not know is refused before anything starts, naming the valid ones."""
    with pytest.raises(ConfigError, match=r"--loglevel loud: not a log level; give one of DEBUG, INFO"):
        worker_logging("loud")
