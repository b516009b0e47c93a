"""The ledger's steps besides a charge, decided once in Python: registering a scope's config, an
operator's reserve grant, a breaker change.

Each is a pure function of the scope's state (`state.ScopeState`, as read) that returns its
answer and its writes (`state.Op`s); the backend applies them atomically (`Ledger._step`).
"""

from __future__ import annotations

__all__ = ["RawRegister", "REGISTER_RETRY", "REGISTER_REFUSED", "decide_register", "decide_grant", "decide_breaker"]

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
    """Store a scope's config (`pid`: the current period under `period_s`, the stored length if any).

    The newest registration wins for future periods; an open block keeps the terms it opened
    with, so while the current period's block exists a change of accounting or period length, or
    a smaller cap, is refused (a larger cap, reserve or warn applies from the next period); so is a
    change of period length while any block starts inside the new length's current period (hourly
    to daily at 10:00 would open a daily block over ten hourly ones)."""
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
