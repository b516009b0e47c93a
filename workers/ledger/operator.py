"""The operator's steps, decided once in Python: a reserve grant and a breaker change.

Each is a pure function of the scope's state (`state.ScopeState`, as read) that returns its
answer and its writes (`state.Op`s); the backend applies them atomically (`Ledger._step`).
"""

from __future__ import annotations

__all__ = ["decide_grant", "decide_breaker"]

from dpstream.topology.errors import InternalError
from dpstream.workers.ledger.decision import AUTO_FIELDS
from dpstream.workers.ledger.state import Op, ScopeState

_MANUAL_FIELDS = ("manual", "manual_reason", "manual_actor", "manual_at")


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
