"""The ledger's steps besides a charge, decided once in Python: registering a scope's config and
its schedule start, an operator's reserve grant, a breaker change, parking a window.

Each is a pure function of the scope's state (`state.ScopeState`, as read) that returns its
answer and its writes (`state.Op`s); the backend applies them atomically (`Ledger._step`).
"""

from __future__ import annotations

__all__ = [
    "RawRegister",
    "REGISTER_RETRY",
    "REGISTER_REFUSED",
    "decide_register",
    "decide_grant",
    "decide_breaker",
    "decide_schedule",
    "decide_park",
    "decide_retry",
    "decide_unpark",
]

import json
from collections.abc import Mapping
from dataclasses import dataclass

from dpstream.topology.errors import InternalError
from dpstream.workers.ledger.decision import AUTO_FIELDS
from dpstream.workers.ledger.state import Op, ScopeState

_MANUAL_FIELDS = ("manual", "manual_reason", "manual_actor", "manual_at")

REGISTER_RETRY = -1
"""`decide_register` answer: the stored period length is not the one the caller named the period with."""
REGISTER_REFUSED = 2
"""`decide_register` answer: the change would alter the open period's terms; nothing is written."""


@dataclass(frozen=True)
class RawRegister:
    """A registration's answer: 0 unchanged, 1 stored, REGISTER_RETRY, or REGISTER_REFUSED with what
    would change ('accounting', 'cap', 'period') and the open block's terms."""

    code: int
    what: str = ""
    block_accounting: str = ""
    block_cap_units: int = 0
    stored_period_s: int = 0


def decide_register(
    s: ScopeState, fields: Mapping[str, str], actor: str, now_ms: int, pid: str, period_s: int
) -> tuple[RawRegister, tuple[Op, ...]]:
    """Store a scope's config (`pid`: the current period under `period_s`, the stored length if any),
    or refuse a change of the open period's terms (`Ledger.register`): a change of period length is
    refused too while any block starts inside the new length's current period (hourly to daily at
    10:00 would open a daily block over ten hourly ones)."""
    cfg = s.config
    old = cfg.get("digest")
    if old == fields["digest"]:
        return RawRegister(0), ()
    if old:
        stored = cfg.get("period_s", "")
        if stored != str(period_s):
            return RawRegister(REGISTER_RETRY), ()
        block = s.periods.get(pid, {})
        if "cap" in block:
            acc = block.get("accounting") or cfg.get("accounting", "")
            what = ""
            if fields["accounting"] != acc:
                what = "accounting"
            elif int(fields["cap"]) < int(block["cap"]):
                what = "cap"
            elif fields["period_s"] != stored:
                what = "period"
            if what:
                return RawRegister(REGISTER_REFUSED, what, acc, int(block["cap"]), int(stored)), ()
        length = int(fields["period_s"])
        if fields["period_s"] != stored and length > 0:
            start = now_ms // 1000 - now_ms // 1000 % length
            if any(start <= b < start + length for b in s.period_index.values()):
                refused = RawRegister(
                    REGISTER_REFUSED, "period", cfg.get("accounting", ""), int(cfg["cap"]), int(stored)
                )
                return refused, ()
    reason = f"config changed {old} -> {fields['digest']}" if old else f"config registered {fields['digest']}"
    entry = ("kind", "config", "cost", fields["cap"], "reason", reason, "actor", actor)
    stored_fields = tuple(x for pair in fields.items() for x in pair) + ("registered_at", str(now_ms))
    return RawRegister(1), (("HSET", ("config",), stored_fields), ("XADD", ("audit",), entry))


def decide_grant(
    s: ScopeState, pid: str, pstart: int, units: int, reason: str, actor: str
) -> tuple[tuple[str, list[int]], tuple[Op, ...]]:
    """Let ordinary metrics draw `units` of period `pid`'s reserve: ('granted', [the period's total
    grant]); or, writing nothing, ('refused', [left, spent, cap, reserve not yet granted]) when more
    is asked than is left to grant: the reserve not yet granted, and no more than the cap has left.
    The grant bumps the block's spend version (a quote priced before it is stale), opens the block
    with the config's terms if need be, and ends an automatic breaker open of the period."""
    cfg, block = s.config, s.periods.get(pid, {})
    cap, reserve = int(block.get("cap", cfg["cap"])), int(block.get("reserve", cfg["reserve"]))
    granted, spent = int(block.get("grant", 0)), int(block.get("spent", 0))
    ungranted = max(0, reserve - granted)
    left = max(0, min(ungranted, cap - spent))
    if units > left:
        return ("refused", [left, spent, cap, ungranted]), ()
    key = ("period", pid)
    ops: list[Op] = []
    if pid not in s.period_index:
        terms = ["cap", cfg["cap"], "reserve", cfg["reserve"], "warn", cfg["warn"]]
        terms += ["accounting", cfg.get("accounting", ""), "delta_cap", cfg.get("delta_cap", "0"), "start", str(pstart)]
        if "period_s" in cfg:  # the block's own length, which every later charge checks
            terms += ["period_s", cfg["period_s"]]
        opened = ("kind", "period", "period", pid, "reason", "period block opened", "actor", "ledger")
        ops += [("ZADDNX", ("periods",), (pstart, pid)), ("HSET", key, tuple(terms)), ("XADD", ("audit",), opened)]
    entry = ("kind", "grant", "period", pid, "cost", str(units), "reason", reason, "actor", actor)
    ops += [("HINCRBY", key, ("grant", units)), ("HINCRBY", key, ("version", 1)), ("XADD", ("audit",), entry)]
    if s.breaker.get("auto_period") == pid:
        closed = ("kind", "breaker_close", "period", pid, "reason", "reserve granted: " + reason, "actor", actor)
        ops += [("HDEL", ("breaker",), AUTO_FIELDS), ("XADD", ("audit",), closed)]
    return ("granted", [granted + units]), tuple(ops)


def decide_breaker(
    s: ScopeState, action: str, reason: str, actor: str, pid: str, now_ms: int
) -> tuple[bool, tuple[Op, ...]]:
    """Open (the manual flag, which stays until closed) or close (the manual flag and any automatic
    open, so the next release is judged by the budget alone); True if it changed."""
    br = s.breaker
    if action == "open":
        if br.get("manual") == "1":
            return False, ()
        fields = ("manual", "1", "manual_reason", reason, "manual_actor", actor, "manual_at", str(now_ms))
        entry = ("kind", "breaker_open", "period", pid, "state", "open", "reason", reason, "actor", actor)
        return True, (("HSET", ("breaker",), fields), ("XADD", ("audit",), entry))
    if action == "close":
        if br.get("manual") != "1" and "auto_period" not in br:
            return False, ()
        entry = ("kind", "breaker_close", "period", pid, "state", "closed", "reason", reason, "actor", actor)
        return True, (("HDEL", ("breaker",), _MANUAL_FIELDS + AUTO_FIELDS), ("XADD", ("audit",), entry))
    raise InternalError(f"breaker: action must be open or close, got {action!r}")


def _audit(kind: str, *fields: str) -> Op:
    """An audit entry of (name, value) pairs; empty values are left out."""
    pairs = [x for name, value in zip(fields[::2], fields[1::2], strict=True) if value for x in (name, value)]
    return ("XADD", ("audit",), ("kind", kind, *pairs))


def decide_schedule(s: ScopeState, start: int) -> tuple[int | None, tuple[Op, ...]]:
    """Record the schedule start S with a registered scope: the first S recorded stays (None, and
    nothing written, for a scope not registered), so every reader projects a first period from one S."""
    if "digest" not in s.config:
        return None, ()
    if "schedule_start" in s.config:
        return int(s.config["schedule_start"]), ()
    return start, (("HSET", ("config",), ("schedule_start", str(start))),)


def decide_park(
    s: ScopeState,
    release_id: str,
    metric: str,
    window: tuple[int, int],
    attempts: int,
    error: str,
    actor: str,
    pid: str,
    now_ms: int,
) -> tuple[bool, tuple[Op, ...]]:
    """Hold a window whose release failed `attempts` times on an internal error (`error`: a class
    name, never a message); True when parked now, False when it was parked already. Only schedule
    facts, counts and the class name are stored or audited."""
    old = s.parked.get(release_id)
    if old is not None and json.loads(old)["state"] == "parked":
        return False, ()
    start, end = window
    entry = {"metric": metric, "window_start": start, "window_end": end, "period": pid, "attempts": attempts}
    entry.update(error=error, parked_at=now_ms, state="parked", actor=actor)
    reason = f"release failed {attempts} times on an internal error ({error}): parked until `dpstream budget retry`"
    audit = _audit(
        "park", "period", pid, "release_id", release_id, "metric", metric, "window_start", str(start),
        "window_end", str(end), "attempts", str(attempts), "error", error, "actor", actor, "state", "parked",
        "reason", reason,
    )  # fmt: skip
    return True, (("HSET", ("parked",), (release_id, json.dumps(entry))), audit)


def decide_retry(s: ScopeState, release_id: str, actor: str, reason: str, now_ms: int) -> tuple[int, tuple[Op, ...]]:
    """Let the worker retry one parked window (every one for ''), audited: how many went from parked to retry."""
    ops: list[Op] = []
    for rid in [release_id] if release_id else sorted(s.parked):
        raw = s.parked.get(rid)
        e = json.loads(raw) if raw is not None else None
        if e is None or e["state"] != "parked":
            continue
        e.update(state="retry", retry_actor=actor, retry_reason=reason, retry_at=now_ms)
        audit = _audit(
            "retry", "period", e["period"], "release_id", rid, "metric", e["metric"], "attempts", str(e["attempts"]),
            "actor", actor, "state", "retry", "reason", reason,
        )  # fmt: skip
        ops += [("HSET", ("parked",), (rid, json.dumps(e))), audit]
    return len(ops) // 2, tuple(ops)


def decide_unpark(s: ScopeState, release_id: str, outcome: str, actor: str) -> tuple[bool, tuple[Op, ...]]:
    """A retried parked window's release finished (`outcome`): it leaves the parked set, audited.
    A parked window leaves only this way: it is never dropped."""
    raw = s.parked.get(release_id)
    if raw is None:
        return False, ()
    e = json.loads(raw)
    audit = _audit(
        "unpark", "period", e["period"], "release_id", release_id, "metric", e["metric"], "actor", actor,
        "state", outcome, "reason", f"parked window released after a retry ({outcome})",
    )  # fmt: skip
    return True, (("HDEL", ("parked",), (release_id,)), audit)
