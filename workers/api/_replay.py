"""Replay events through the whole pipeline from Python: `dpstream replay` without the files.

The engine is `dpstream.workers.runtime.replay.replay_lines`, driven as the CLI drives it: the
ledger prices from the replay's public start, and the records are the ledger's stored bytes.
"""

from __future__ import annotations

__all__ = ["Release", "Replay", "replay", "replay_async"]

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dpstream.topology.errors import ConfigError

from ._costs import Cost, Epsilon, Rho
from ._ledger import MEMORY, Ledger, utc_seconds
from ._sync import EventLoopThread

if TYPE_CHECKING:
    from dpstream.topology.model import Topology
    from dpstream.workers.ledger import Ledger as CoreLedger

Event = Mapping[str, Any] | bytes | str
"""One event: a dict of JSON values, or one JSON object as bytes (a line of a JSON-lines file) or str."""


@dataclass(frozen=True)
class Release:
    """One published release record: what a consumer of the releases topic reads.

    `values` maps each released key to its noisy value (`""` for a metric without `group_by`);
    a top-k release lists its `keys` in rank order. `record` is the whole record (cost, noise,
    CI, budget ratio after it…) and `raw` its exact bytes, as `dpstream replay` prints them.
    """

    release_id: str
    metric: str
    scope: str
    window_start: datetime
    window_end: datetime
    published_at: datetime
    """The release's public time: the window's close time plus the topology's publish delay."""
    cost: Cost
    values: Mapping[str, Any]
    keys: tuple[str, ...]
    record: Mapping[str, Any] = field(repr=False)
    raw: bytes = field(repr=False)

    @classmethod
    def of(cls, raw: bytes) -> Release:
        """The release of a record's bytes (a line of `dpstream replay`'s output or a releases-topic value)."""
        import json

        record = json.loads(raw)
        window, cost = record["window"], record["cost"]
        return cls(
            release_id=record["release_id"],
            metric=record["metric"],
            scope=record["budget"]["scope"],
            window_start=datetime.fromtimestamp(window["start_epoch"], tz=UTC),
            window_end=datetime.fromtimestamp(window["end_epoch"], tz=UTC),
            published_at=datetime.fromisoformat(record["published_at"]),
            cost=Rho(cost["rho"]) if "rho" in cost else Epsilon(cost["epsilon"]),
            values=record["values"],
            keys=tuple(record.get("keys", ())),
            record=record,
            raw=bytes(raw),
        )


@dataclass(frozen=True)
class Replay:
    """What a replay released: iterate it for the `Release`s, in publication order.

    `release_counts` counts every window of the schedule by outcome (`published`,
    `refused_budget`, `expired`, …) and `refusal_reasons` the reasons of those not published;
    both follow from the public schedule and the budget. `curator_event_counts` are exact counts
    of the input events by outcome (accepted, capped, dead-lettered by reason): for the curator's
    eyes only, never for publication.
    """

    releases: tuple[Release, ...]
    release_counts: Mapping[str, int]
    refusal_reasons: Mapping[str, int]
    curator_event_counts: Mapping[str, int] = field(repr=False)
    ledger_id: str | None = None
    """The ledger the releases were charged to; None: the in-process one (charged to no ledger)."""

    def __iter__(self) -> Iterator[Release]:
        return iter(self.releases)

    def __len__(self) -> int:
        return len(self.releases)


def _event_lines(events: Iterable[Event]) -> Iterator[bytes]:
    """Each event as one JSON line, lazily; anything that is not an event is a ConfigError naming its index."""
    import orjson

    for i, event in enumerate(events):
        if isinstance(event, bytes | bytearray | memoryview):
            yield bytes(event)
        elif isinstance(event, str):
            yield event.encode()
        elif isinstance(event, Mapping):
            try:
                yield orjson.dumps(dict(event))
            except TypeError as exc:
                raise ConfigError(f"events[{i}]: not JSON-serialisable ({exc}); give JSON values") from None
        else:
            raise ConfigError(
                f"events[{i}]: a {type(event).__name__}, not an event; give a dict or one JSON object as bytes"
            )


def _topology(topology: Topology | str | os.PathLike[str]) -> Topology:
    from dpstream.topology.loader import load_topology
    from dpstream.topology.model import Topology

    return topology if isinstance(topology, Topology) else load_topology(topology)


async def _run(
    topology: Topology,
    events: Iterable[Event],
    core: CoreLedger,
    start: int,
    end: int,
    source: str | None,
    partitions: int,
    actor: str,
) -> Replay:
    from dpstream.workers.runtime.replay import replay_lines

    raws: list[bytes] = []

    async def publish(value: bytes, key: bytes) -> None:
        raws.append(value)

    # the replay's schedule starts at `start`: the ledger prices that first period from there
    core.use_schedule_start(start)
    summary = await replay_lines(
        topology,
        _event_lines(events),
        core,
        publish,
        start=start,
        end=end,
        source=source,
        partitions=partitions,
        actor=actor,
    )
    return Replay(
        releases=tuple(Release.of(raw) for raw in raws),
        release_counts=summary.releases.snapshot(),
        refusal_reasons=dict(summary.releases.reasons),
        curator_event_counts=summary.events.snapshot(),
        ledger_id=core.ledger_id,
    )


def _checked_span(topology: Topology, start: int | datetime, end: int | datetime, partitions: int) -> tuple[int, int]:
    """[start, end) in epoch seconds, after the checks `dpstream replay` makes before opening a ledger."""
    from dpstream.workers.pipeline.unit_ids import check_unit_hashing

    check_unit_hashing(topology)  # before the ledger registers anything
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ConfigError(f"partitions {partitions!r}: need a whole number >= 1")
    return utc_seconds(start, "start"), utc_seconds(end, "end")


async def replay_async(
    topology: Topology | str | os.PathLike[str],
    events: Iterable[Event],
    *,
    start: int | datetime,
    end: int | datetime,
    ledger: str | CoreLedger = MEMORY,
    source: str | None = None,
    partitions: int = 1,
    actor: str = "replay:python",
) -> Replay:
    """`replay` for async code (`await dpstream.replay_async(...)`), e.g. in a notebook cell.

    `ledger` is `"memory"`, a Redis URL (opened and closed around the replay), or an async ledger
    from `dpstream.workers.ledger.open_ledger` opened in the same event loop.
    """
    from dpstream.workers.ledger import open_ledger as open_core

    loaded = _topology(topology)
    span = _checked_span(loaded, start, end, partitions)
    if not isinstance(ledger, str):
        return await _run(loaded, events, ledger, *span, source, partitions, actor)
    core = await open_core(ledger, loaded, actor=actor, schedule_start=span[0])
    try:
        return await _run(loaded, events, core, *span, source, partitions, actor)
    finally:
        await core.close()


def replay(
    topology: Topology | str | os.PathLike[str],
    events: Iterable[Event],
    *,
    start: int | datetime,
    end: int | datetime,
    ledger: str | Ledger = MEMORY,
    source: str | None = None,
    partitions: int = 1,
    actor: str = "replay:python",
) -> Replay:
    """Run `events` through the worker's pipeline (bounding, windows, noise, ledger) and release every
    window of [start, end), like `dpstream replay FILE EVENTS --from START --to END`.

    `start` and `end` are the public release schedule (epoch seconds, or datetimes with a time
    zone), required and never taken from the events: a schedule read off the data would let one
    person's timestamp add releases. Every window in the range is released, empty or not; events
    outside it are dead-lettered (`out_of_range`). `events` is any iterable of dicts or JSON
    bytes, one event each (each counts as arrived at its own event time); `source` names their
    source when the topology has several; `partitions` spreads units as a keyed topic would.
    `ledger` is `"memory"` (a fresh in-process ledger), a Redis URL, or a `Ledger` from
    `open_ledger` (opened with the same topology) to ask for its `status` afterwards.
    """
    loaded = _topology(topology)
    if isinstance(ledger, str):
        runner = EventLoopThread()
        try:
            return runner.run(
                replay_async(
                    loaded,
                    events,
                    start=start,
                    end=end,
                    ledger=ledger,
                    source=source,
                    partitions=partitions,
                    actor=actor,
                )
            )
        finally:
            runner.close()
    if not isinstance(ledger, Ledger):
        raise ConfigError(
            f"replay: ledger {type(ledger).__name__}: give 'memory', a Redis URL or a dpstream.open_ledger(...) "
            "handle (an async ledger goes to replay_async)"
        )
    if ledger.topology is None or ledger.topology.topology_version != loaded.topology_version:
        raise ConfigError(
            f"replay: the ledger {ledger.where!r} was opened without this topology; "
            "open it with dpstream.open_ledger(where, topology)"
        )
    span = _checked_span(loaded, start, end, partitions)
    result: Replay = ledger.run(_run(loaded, events, ledger.core, *span, source, partitions, actor))
    return result
