"""open_ledger_waiting: retries while the ledger is unavailable, with growing waits; other errors pass through."""

from __future__ import annotations

import asyncio

import pytest

from dpstream.workers.ledger.errors import LedgerUnavailable
from dpstream.workers.runtime.ledger_wait import START_RETRY_MAX_S, open_ledger_waiting


def test_retries_until_the_ledger_answers_with_growing_waits() -> None:
    calls, waits = [], []

    async def attempt() -> str:
        calls.append(1)
        if len(calls) < 7:
            raise LedgerUnavailable("ledger Redis redis://127.0.0.1:1/0 unavailable: refused")
        return "ledger"

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    assert asyncio.run(open_ledger_waiting(attempt, "test", sleep)) == "ledger"
    assert len(calls) == 7
    assert waits == [1.0, 2.0, 4.0, 8.0, START_RETRY_MAX_S, START_RETRY_MAX_S]


def test_other_errors_are_not_retried() -> None:
    async def attempt() -> str:
        raise ValueError("a bug")

    async def sleep(seconds: float) -> None:
        raise AssertionError("no wait expected")

    with pytest.raises(ValueError):
        asyncio.run(open_ledger_waiting(attempt, "test", sleep))
