"""Restarts a Faust table recovery that stopped making progress (the release side's state would stall).

A worker that gains a metric's partials partition rebuilds the metric's state from the table's
changelog before its agent reads on. Under load, with two rebalances in a row (a member joins, another
leaves), Faust 0.15's recovery was seen to wait forever for changelog records it never received
(`No event received for active tp ... since recovery start`, repeated for minutes): the metric's
windows were then never released. Restarting the recovery (what a rebalance does: highwaters, offsets,
seek, resume) reads the changelog again. The watch restarts only a recovery whose offsets have not
moved for `stall_s`, so a long but progressing recovery is left alone.
"""

from __future__ import annotations

__all__ = ["RecoveryProgress", "RECOVERY_STALL_S", "watch_recovery"]

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

_log = logging.getLogger(__name__)

RECOVERY_STALL_S = 15.0
"""Seconds without any changelog offset moving, records still to read, before a recovery is restarted."""

CHECK_INTERVAL_S = 1.0
"""How often the watch looks at the recovery."""


@dataclass
class RecoveryProgress:
    """Decides, from successive looks at a recovery, when it has stalled (pure: no Faust in here)."""

    stall_s: float = RECOVERY_STALL_S
    _seen: dict[Any, int] = field(default_factory=dict)
    _since: float | None = None

    def stalled(self, now: float, in_recovery: bool, remaining: int, offsets: dict[Any, int]) -> bool:
        """True once a recovery with `remaining` records to read has shown the same `offsets` for
        `stall_s` seconds; the clock restarts on any move, on the end of recovery, and after a True."""
        if not in_recovery or remaining <= 0 or offsets != self._seen:
            self._seen = dict(offsets)
            self._since = now if in_recovery and remaining > 0 else None
            return False
        if self._since is None:
            self._since = now
            return False
        if now - self._since < self.stall_s:
            return False
        self._since = now  # give the restarted recovery its own stall_s
        return True


async def watch_recovery(app: Any, clock: Any, progress: RecoveryProgress | None = None) -> None:
    """Look at `app`'s table recovery every `CHECK_INTERVAL_S` until cancelled; restart it when stalled."""
    progress = progress or RecoveryProgress()
    while True:
        await asyncio.sleep(CHECK_INTERVAL_S)
        recovery = app.tables.recovery
        offsets = dict(recovery.active_offsets)
        if progress.stalled(clock(), bool(recovery.in_recovery), recovery.active_remaining_total(), offsets):
            stuck = {f"{tp.topic}[{tp.partition}]": off for tp, off in recovery.active_remaining().items() if off}
            _log.warning(
                "release side: table recovery made no progress for %g s (records left: %s); restarting it",
                progress.stall_s,
                stuck,
            )
            recovery.signal_recovery_start.set()
