"""The documented extra hop for sources not keyed by their privacy unit: copy each event, keyed by unit.

A consumer-group member reads the source topic in batches, extracts the unit field (a cheap parse),
and produces the unchanged bytes to `<topic>.by-unit` with Kafka key = unit and the source position
as a header, committing after the acks (a restart before the commit copies a batch again: the by-unit
pipeline counts a position once, `workers.pipeline.copies`). Events without a readable unit are
forwarded with their original key: the core dead-letters them with the right reason (the DLQ record
then names the repartition topic's partition and offset).
With `privacy_unit_hash` on, the copy's unit field and key are the keyed hash instead, and an event
without a usable unit is dead-lettered by the hop itself (naming the source topic's partition and
offset), so no raw unit id reaches the by-unit topic.
"""

from __future__ import annotations

__all__ = ["RepartitionService"]

import asyncio
import json
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from mode import Service

from dpstream.topology.errors import ConfigError, EventError
from dpstream.topology.model import Source, Topology
from dpstream.workers.pipeline.copies import SOURCE_POSITION_HEADER, source_position
from dpstream.workers.pipeline.counters import EventCounts
from dpstream.workers.pipeline.events import DeadLetter, EventParser
from dpstream.workers.pipeline.unit_ids import hashed_copy, refusal_reason, unit_hasher
from dpstream.workers.runtime.settings import RuntimeSettings
from dpstream.workers.runtime.topics import repartition_topic, timestamp_rules

_log = logging.getLogger(__name__)

try:
    from orjson import dumps as _dumps
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    from json import loads as _loads  # type: ignore[assignment]  # the stdlib fallback: same use, wider signature

    def _dumps(obj: Any) -> bytes:  # type: ignore[misc]  # the stdlib fallback of orjson.dumps
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def _unit_key(raw: bytes | None, parser: EventParser) -> bytes | None:
    """The event's unit as the by-unit pipeline will read it, as the copy's Kafka key; None when it has
    none (forwarded under its own key, the ingest dead-letters it)."""
    try:
        unit = parser.unit(raw)
    except EventError:
        return None
    return None if unit is None else unit.encode()


class RepartitionService(Service):
    """Copies the sources that need it into their by-unit topics."""

    def __init__(
        self,
        topology: Topology,
        settings: RuntimeSettings,
        sources: list[Source],
        counts: dict[str, EventCounts] | None = None,
        **kwargs: Any,
    ) -> None:
        """`counts`: source → counts of the events the hop dead-letters itself (shown in /metrics as invalid)."""
        self.topology = topology
        self.counts = {} if counts is None else counts
        self.settings = settings
        self._targets = {s.topic: repartition_topic(s) for s in sources}
        self._hashers = {s.topic: unit_hasher(s) for s in sources}
        """Sources with `privacy_unit_hash`: the hop forwards the keyed hash, never the raw unit id."""
        self._parsers = {s.topic: EventParser(s) for s in sources}
        self._rules = timestamp_rules(topology)
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self.copied = 0
        super().__init__(**kwargs)

    async def on_start(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.bootstrap,
            linger_ms=5,
            acks="all",
            enable_idempotence=True,
            **self.settings.kafka_options(),
        )
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            *self._targets,
            bootstrap_servers=self.settings.bootstrap,
            group_id=f"{self.settings.group_id(self.topology)}-repartition",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=self.settings.fetch_timeout_ms,
            **self.settings.group_timeouts(),
            **self.settings.kafka_options(),
        )
        await self._consumer.start()
        self.add_future(self._copy_forever())

    async def on_stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()

    def _check_copy_times(self, copies: list[asyncio.Future[Any]]) -> None:
        """Stop (ConfigError, before the commit: the batch is copied again after the fix) when the broker
        stamped a copy itself: a by-unit topic changed to LogAppendTime while the hop runs would replace
        each copy's source append time by its copy time, so inclusion would follow the hop's timing."""
        for copy in copies:
            metadata = copy.result()
            rule = self._rules.get(metadata.topic)
            problem = rule.record_problem(metadata.timestamp_type) if rule is not None else None
            if problem is not None:
                raise ConfigError(problem)

    async def _copy_forever(self) -> None:
        assert self._consumer is not None and self._producer is not None
        while not self.should_stop:
            try:
                batches = await self._consumer.getmany(timeout_ms=self.settings.fetch_timeout_ms, max_records=5000)
            except (KafkaError, IllegalStateError):
                if self.should_stop:
                    return
                await asyncio.sleep(0.5)
                continue
            sends, copies = [], []
            for tp, records in batches.items():
                target, parser = self._targets[tp.topic], self._parsers[tp.topic]
                hasher = self._hashers[tp.topic]
                for rec in records:
                    value, key = rec.value, None
                    if hasher is None:
                        key = _unit_key(rec.value, parser)
                    elif (hashed := hashed_copy(rec.value, parser, hasher, _loads, _dumps)) is not None:
                        value, key = hashed
                    else:  # no unit to hash: dead-lettered here, so no raw id reaches the by-unit topic
                        letter = DeadLetter(
                            refusal_reason(rec.value, parser),
                            parser.source.name,
                            tp.topic,
                            tp.partition,
                            rec.offset,
                            rec.value or b"",
                        )
                        sends.append(await self._producer.send(self.topology.sinks.dead_letter, letter.to_bytes()))
                        self.counts.setdefault(letter.source, EventCounts()).invalid[letter.reason] += 1
                        continue
                    key = key or rec.key
                    # the source position lets the by-unit pipeline count a second copy once (a restart
                    # before the commit below copies the batch again)
                    where = [(SOURCE_POSITION_HEADER, source_position(tp.partition, rec.offset))]
                    copy = await self._producer.send(target, value, key=key, timestamp_ms=rec.timestamp, headers=where)
                    sends.append(copy)
                    copies.append(copy)
            if not sends:
                continue
            await asyncio.gather(*sends)
            self._check_copy_times(copies)
            self.copied += len(sends)
            try:
                await self._consumer.commit()
            except (CommitFailedError, IllegalStateError, KafkaError) as exc:
                _log.info("repartition: commit skipped (%s)", type(exc).__name__)
