"""Which partitions the worker's Faust consumer reads again from the beginning when Faust seeks to
committed offsets (`rewinding_consumer`): those nobody committed (None or 0), never a changelog."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aiokafka import TopicPartition
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

from dpstream.workers.runtime.rewinding_consumer import RewindingConsumer, _RewindingThread

PARTIALS, CHANGELOG = "t.releases.partials", "app-dpstream-mergers-changelog"


def test_uncommitted_partitions_are_rewound_committed_and_changelog_ones_are_not(monkeypatch) -> None:
    committed = {
        TopicPartition(PARTIALS, 0): None,  # never committed: its fetched-and-dropped records come again
        TopicPartition(PARTIALS, 1): 0,  # committed at 0: aiokafka does not seek it either
        TopicPartition(PARTIALS, 2): 17,  # aiokafka seeks it to 17 itself
        TopicPartition(CHANGELOG, 0): None,  # the table recovery positions changelogs
    }

    async def aiokafka_seek(self) -> dict:
        return committed

    rewound: list[TopicPartition] = []

    async def seek_to_beginning(*tps: TopicPartition) -> None:
        rewound.extend(tps)

    monkeypatch.setattr(AIOKafkaConsumerThread, "seek_to_committed", aiokafka_seek)
    thread = object.__new__(_RewindingThread)  # no Faust consumer behind it: the rule alone
    thread.app = SimpleNamespace(tables=SimpleNamespace(changelog_topics={CHANGELOG}))
    thread.seek_to_beginning = seek_to_beginning  # type: ignore[method-assign]  # records instead of seeking
    assert asyncio.run(thread.seek_to_committed()) == committed
    assert rewound == [TopicPartition(PARTIALS, 0), TopicPartition(PARTIALS, 1)]


def test_the_worker_app_uses_it() -> None:
    from dpstream.workers.runtime.app import new_app
    from dpstream.workers.runtime.settings import RuntimeSettings

    app = new_app("dpstream-test-rewind", RuntimeSettings(bootstrap="127.0.0.1:9", redis_url="memory://"))
    assert app.transport.Consumer is RewindingConsumer
