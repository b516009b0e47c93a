"""Run dpstream's async internals from plain (sync) code, notebooks included.

A notebook's kernel already runs an event loop in the main thread, where `asyncio.run` refuses to
start a second one. So every sync call runs its coroutine on an event loop of its own, in a
background thread, and waits for it. One `EventLoopThread` serves one ledger for its whole life:
a Redis connection belongs to the loop that opened it.
"""

from __future__ import annotations

__all__ = ["EventLoopThread"]

import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")


class EventLoopThread:
    """An event loop running in a daemon thread; `run(coro)` waits for the coroutine's result."""

    def __init__(self) -> None:
        import asyncio  # here, not at import: `import dpstream` (and so the CLI) starts without asyncio

        self._loop: asyncio.AbstractEventLoop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dpstream-api", daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        """True once `close()` ran."""
        return self._loop.is_closed()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """The result of `coro`, run on this thread's loop; its exception is raised here."""
        if self.closed:
            coro.close()
            from dpstream.topology.errors import ConfigError

            raise ConfigError("this ledger is closed; open it again with dpstream.open_ledger(...)")
        import asyncio

        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:  # Ctrl-C while waiting: stop the coroutine too
            future.cancel()
            raise

    def close(self) -> None:
        """Stop the loop and its thread (idempotent)."""
        if self.closed:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
