"""Release time is public: P(w) = C(w) + publish_delay, stamped in the record and the Kafka timestamp."""

from __future__ import annotations

import asyncio
import json

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import DEFAULT_PUBLISH_DELAY_S
from dpstream.topology.plan import build_plan, plan_to_json
from dpstream.topology.plan_render import render_plan
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.testing import ManualClock
from dpstream.workers.release import Releaser
from dpstream.workers.release.record import iso_utc, publish_time_of
from dpstream.workers.runtime.releases import PublicTimePublisher

_YAML = """
version: 1
{extra}
sources:
  s: {{topic: t, privacy_unit: user_id, timestamp: ts, allowed_lateness: 7s}}
budgets:
  b: {{epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}}
metrics:
  views:
    source: s
    budget: b
    window: {{tumbling: 1h}}
    aggregate: count
    mechanism: gaussian
sinks: {{releases: r, dead_letter: d}}
"""

_T0 = 1_796_000_400  # an hour boundary


def _topology(extra: str = ""):
    return load_topology_text(_YAML.format(extra=extra))


def test_publish_delay_defaults_and_is_read_as_a_duration():
    """publish_delay is a topology duration with a default, outside the topology version;
    P(w) = end + allowed_lateness + publish_delay."""
    plain, slow = _topology(), _topology("publish_delay: 2m")
    assert plain.publish_delay_s == DEFAULT_PUBLISH_DELAY_S > 0
    assert slow.publish_delay_s == 120
    metric = plain.metrics["views"]
    assert plain.publish_time(metric, _T0 + 3600) == _T0 + 3600 + 7 + DEFAULT_PUBLISH_DELAY_S
    assert slow.publish_time(metric, _T0 + 3600) == _T0 + 3600 + 7 + 120
    # when releases appear is not what they hold or cost: the same release_ids (and charges) either way
    assert slow.topology_version == plain.topology_version


def test_a_bad_publish_delay_is_one_line_naming_the_field():
    """A publish_delay that is not a duration is refused with the field and an example."""
    with pytest.raises(ConfigError, match=r"publish_delay 'soon': not a duration; write e\.g\. 30s"):
        _topology("publish_delay: soon")


def test_the_plan_shows_the_publish_delay():
    """`dpstream plan` (text and JSON) states the publish delay of the release schedule."""
    plan = build_plan(_topology("publish_delay: 45s"))
    assert plan_to_json(plan)["publish_delay_s"] == 45
    assert "publish_delay 45s" in render_plan(plan)


def test_a_release_record_is_stamped_with_its_public_time_not_the_processing_time():
    """published_at is P(w), whatever the clock read when the record was built or charged."""

    async def go(now: float) -> dict:
        topo = _topology()
        ledger = await open_ledger("memory", topo, clock=ManualClock(now))
        sent: list[bytes] = []

        async def publish(value: bytes, key: bytes) -> None:
            sent.append(value)

        await Releaser(topo, ledger).release("views", (_T0, _T0 + 3600), {"": 3}, publish)
        return json.loads(sent[0])

    early, late = asyncio.run(go(_T0 + 3601)), asyncio.run(go(_T0 + 3600 + 900))
    expected = iso_utc(_T0 + 3600 + 7 + DEFAULT_PUBLISH_DELAY_S)
    assert early["published_at"] == late["published_at"] == expected


class _Manual:
    """A manual worker clock whose sleep advances it."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _record(published_at: int) -> bytes:
    return json.dumps({"published_at": iso_utc(published_at), "release_id": "r"}, separators=(",", ":")).encode()


def test_a_release_is_held_until_its_public_time_and_stamped_with_it():
    """Ready before P(w): produced only once the worker clock reaches P(w), with Kafka timestamp P(w)."""
    clock = _Manual(_T0 + 0.25)
    sent: list[tuple[bytes, bytes, int | None]] = []

    async def send(value: bytes, key: bytes, timestamp_ms: int | None) -> None:
        sent.append((value, key, timestamp_ms))
        assert clock.now >= _T0 + 5  # never before P(w)

    publisher = PublicTimePublisher(send, clock=clock.clock, sleep=clock.sleep)
    record = _record(_T0 + 5)
    assert not publisher.missed(record)
    asyncio.run(publisher.publish(record, b"r"))
    assert clock.slept == [4.75]
    assert sent == [(record, b"r", (_T0 + 5) * 1000)]


def test_a_release_that_misses_its_public_time_goes_at_once_still_stamped_with_it():
    """Ready after P(w): counted as a miss, produced without waiting, Kafka timestamp still P(w)."""
    clock = _Manual(_T0 + 9)
    sent: list[int | None] = []

    async def send(value: bytes, key: bytes, timestamp_ms: int | None) -> None:
        sent.append(timestamp_ms)

    publisher = PublicTimePublisher(send, clock=clock.clock, sleep=clock.sleep)
    record = _record(_T0 + 5)
    assert publisher.missed(record)
    asyncio.run(publisher.publish(record, b"r"))
    assert clock.slept == [] and sent == [(_T0 + 5) * 1000]


def test_publish_time_is_read_back_from_the_record_bytes():
    """The P(w) in a record's canonical bytes is what the release agent holds and stamps it by."""
    assert publish_time_of(_record(_T0 + 12)) == _T0 + 12
    assert publish_time_of(b'{"release_id":"r"}') is None
    assert publish_time_of(b'{"published_at":"not a time at all!"}') is None


def test_releases_waiting_for_their_public_time_hold_no_dispatch_slot():
    """With one slot, three windows of one close time all reach their hold (charged before P(w)):
    a release waiting for P(w) gives its slot up, so none waits for another's P(w)."""
    from dpstream.workers.pipeline.merger import MergedWindow
    from dpstream.workers.release.dispatch import ReleaseDispatcher

    async def go() -> list[str]:
        public_time = asyncio.Event()
        holding: list[str] = []
        all_holding = asyncio.Event()
        dispatcher: ReleaseDispatcher

        async def release(window: MergedWindow) -> None:
            async with dispatcher.outside_slot():
                holding.append(window.metric)
                if len(holding) == 3:
                    all_holding.set()
                await public_time.wait()  # the hold until P(w)

        dispatcher = ReleaseDispatcher(release, max_concurrent=1)
        for name in ("a", "b", "c"):
            assert dispatcher.dispatch(MergedWindow(name, _T0, _T0 + 60, {}))
        await asyncio.wait_for(all_holding.wait(), timeout=30)  # a bound on a hang, not a timing assertion
        public_time.set()
        await dispatcher.drain()
        return holding

    assert asyncio.run(go()) == ["a", "b", "c"]


@pytest.mark.parametrize("delay", ["2d", "1" + "0" * 400])
def test_a_publish_delay_past_a_day_is_one_line_naming_the_field(delay: str):
    """publish_delay longer than a day (or a number too large for any clock) is a one-line ConfigError,
    not an OverflowError later when P(w) is computed."""
    with pytest.raises(ConfigError, match="publish_delay .*longer than a day") as err:
        _topology(f"publish_delay: {delay}")
    assert "\n" not in str(err.value)


def test_a_publish_delay_of_a_day_is_accepted():
    """The bound itself is a legal delay."""
    assert _topology("publish_delay: 1d").publish_delay_s == 86_400
