"""Chaos-test crash hook: `crash_point(step)` SIGKILLs this process at a named release step, only when armed.

The chaos suite (tests/chaos/) needs a worker to die exactly between charge and publish, or between
publish and commit. Off unless BOTH variables are set, so one stray variable cannot enable it:

    DPSTREAM_CHAOS_CRASH=after_charge@3        # die the 3rd time this process passes after_charge
    DPSTREAM_CHAOS_ARMED=crash-this-worker-for-a-chaos-test

Read once at import; when off, `crash_point` is one global lookup and a return. Deterministic (a pass
count, no RNG), so the test decides where each worker dies.
"""

from __future__ import annotations

__all__ = ["ARM_ENV", "ARM_PHRASE", "CRASH_ENV", "STEPS", "crash_point"]

import os
import signal

CRASH_ENV = "DPSTREAM_CHAOS_CRASH"
"""`<step>@<n>`: die on the n-th pass (n ≥ 1) through `step`."""
ARM_ENV = "DPSTREAM_CHAOS_ARMED"
"""Must equal `ARM_PHRASE`, or `CRASH_ENV` is ignored."""
ARM_PHRASE = "crash-this-worker-for-a-chaos-test"
STEPS = ("after_charge", "after_publish")
"""after_charge: charged in the ledger, not published; after_publish: published, not committed."""


def _plan() -> tuple[str, int] | None:
    """(step, n) from the environment when armed; a malformed armed value is an error (a test bug)."""
    spec = os.environ.get(CRASH_ENV, "")
    if not spec or os.environ.get(ARM_ENV) != ARM_PHRASE:
        return None
    step, _, count = spec.partition("@")
    if step not in STEPS or not count.isdigit() or int(count) < 1:
        raise ValueError(f"{CRASH_ENV}={spec!r}: give <step>@<n> with step one of {', '.join(STEPS)} and n >= 1")
    return step, int(count)


_PLAN = _plan()
ARMED = _PLAN is not None
"""Whether a crash is planned in this process (fixed at import, as the plan is): callers test it
before calling `crash_point`, so an unarmed release pays one global read per step."""
_passes = 0


def crash_point(step: str) -> None:
    """SIGKILL this process on the planned pass through `step` (no-op unless armed)."""
    global _passes
    if _PLAN is None or _PLAN[0] != step:
        return
    _passes += 1
    if _passes == _PLAN[1]:
        os.kill(os.getpid(), signal.SIGKILL)
