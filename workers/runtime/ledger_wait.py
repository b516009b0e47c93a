"""Open the ledger at a worker's start, waiting for it: an outage at start delays the worker, it does not kill it.

A worker that exited on `LedgerUnavailable` while Redis was down (restarting, failing over, stopped
for maintenance) only crash-looped under its supervisor. Waiting keeps it failing closed (nothing is
consumed or released before the ledger answered) without the crash loop.
"""

from __future__ import annotations

__all__ = ["open_ledger_waiting", "START_RETRY_MAX_S"]

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from dpstream.workers.ledger.errors import LedgerUnavailable

_T = TypeVar("_T")

START_RETRY_MAX_S = 10.0
"""The longest wait between two attempts (1, 2, 4, 8, 10, 10, … s)."""

log = logging.getLogger("dpstream.worker")


async def open_ledger_waiting(
    attempt: Callable[[], Awaitable[_T]], what: str, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
) -> _T:
    """`await attempt()` until it no longer raises `LedgerUnavailable`, logging one line per failure
    (the error's own one line: it names the URL without its password, never a value)."""
    delay = 1.0
    while True:
        try:
            return await attempt()
        except LedgerUnavailable as exc:
            log.warning("%s: ledger unavailable (%s); retrying in %.0f s", what, exc, delay)
            await sleep(delay)
            delay = min(START_RETRY_MAX_S, delay * 2)
