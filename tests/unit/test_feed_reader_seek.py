"""The feed reader's start position: a record appended while the reader starts is never skipped."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dpstream.workers.feed.reader import _seek

pytestmark = pytest.mark.unit


class _AppendsDuringTheTimeLookup:
    """A consumer stub on one empty partition where one record (timestamp after `since`) lands while
    the time index is being read: too late for that lookup, in time for any end-offset read after it."""

    def __init__(self) -> None:
        self.appended = False
        self.position: dict[Any, int] = {}

    async def seek_to_beginning(self, *tps: Any) -> None:
        self.position.update({tp: 0 for tp in tps})

    async def offsets_for_times(self, query: dict[Any, int]) -> dict[Any, None]:
        self.appended = True
        return dict.fromkeys(query)

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: int(self.appended) for tp in tps}

    def seek(self, tp: Any, offset: int) -> None:
        self.position[tp] = offset


def test_a_record_appended_between_the_lookups_is_read() -> None:
    """The end offset is read before the time index, so the new record (offset 0) is ahead of the
    reader; the other order seeked past it (offset 1) and the exporter never showed it."""
    consumer = _AppendsDuringTheTimeLookup()
    asyncio.run(_seek(consumer, ["p0"], since_s=1_000.0))
    assert consumer.position == {"p0": 0}
