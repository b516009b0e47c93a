"""Time the release side's ledger calls: a thin proxy around the ledger the `Releaser` is given.

`dpstream_ledger_request_duration_seconds{op}` and `dpstream_ledger_errors_total{op}` for the five
calls of the release protocol and the sweeper (quote, charge, commit, stored_payload, stored_charge, pending).
Every other attribute passes through untouched and untimed. The proxy sees only the call and
whether it raised: no argument, payload or result is kept.
"""

from __future__ import annotations

__all__ = ["LEDGER_OPS", "LedgerTimings", "TimedLedger"]

import time
from collections import Counter
from typing import Any

from dpstream.workers.telemetry.histogram import LEDGER_BUCKETS, LabelledHistogram

LEDGER_OPS = ("quote", "charge", "commit", "stored_payload", "stored_charge", "pending")
"""The timed ledger calls (the `op` label)."""


class LedgerTimings:
    """Durations and errors of ledger calls by op (every op present, zero until called)."""

    def __init__(self) -> None:
        self.durations = LabelledHistogram("op", LEDGER_OPS, LEDGER_BUCKETS)
        self.errors: Counter[str] = Counter({op: 0 for op in LEDGER_OPS})


class TimedLedger:
    """Forwards to `ledger`; the calls named in LEDGER_OPS are timed and their errors counted."""

    def __init__(self, ledger: Any, timings: LedgerTimings) -> None:
        self._ledger = ledger
        self._timings = timings

    @property
    def wrapped(self) -> Any:
        """The ledger behind the proxy."""
        return self._ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    async def _timed(self, op: str, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await getattr(self._ledger, op)(*args, **kwargs)
        except BaseException as exc:
            if isinstance(exc, Exception):  # a cancelled call is not a ledger error
                self._timings.errors[op] += 1
            raise
        finally:
            self._timings.durations.observe(op, time.perf_counter() - started)

    async def quote(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed("quote", *args, **kwargs)

    async def charge(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed("charge", *args, **kwargs)

    async def commit(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed("commit", *args, **kwargs)

    async def stored_payload(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed("stored_payload", *args, **kwargs)

    async def stored_charge(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed("stored_charge", *args, **kwargs)

    async def pending(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed("pending", *args, **kwargs)
