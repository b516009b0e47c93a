"""The charge decision, once, in Python: `decide(view, charge)` → what to answer and what to write.

A pure function of what a backend read (`View`) and what the caller asked (`Charge`): it never
writes; its `Decision` lists the writes (blocks to open, counters to add, breaker changes, audit
entries, the release record) and the backend applies them in the same atomic step as the read.
The in-process ledger applies it under its lock; `lua/charge.lua` states the same rules for
Redis, where the script must decide by itself (see DESIGN notes in `redis_backend`).

Rules, in order: a known release id answers its first stored bytes; an expired window and a
stale quote answer, writing nothing; an automatic breaker open of an earlier period closes; then
the first refusal (topology digest, a block's fixed terms, the breakers, each period's cap,
pool and selection δ) is counted and audited; else every period the window touches is charged.
"""

from __future__ import annotations

__all__ = ["View", "Charge", "ChargeTerms", "Decision", "RawCharge", "decide", "state_of", "audit_entry"]

from collections.abc import Mapping
from typing import NamedTuple

from dpstream.workers.ledger.types import RATIO_TOKEN, ReleaseRequest, State

_EMPTY: Mapping[str, str] = {}

_ALWAYS = ("kind", "period", "spent", "ratio", "actor")
"""Audit fields every charge-time entry carries; other empty fields are left out (as charge.lua does)."""

_AUTO_FIELDS = ("auto_period", "auto_start", "auto_reason", "auto_at")


def state_of(spent_units: int, warn_units: int, is_open: bool) -> State:
    """normal / warning / open, from the spend and the breaker (the one rule; charge.lua states it too)."""
    if is_open:
        return State.OPEN
    return State.WARNING if spent_units >= warn_units else State.NORMAL


def _state(spent: int, warn: int, is_open: bool) -> str:
    return "open" if is_open else ("warning" if spent >= warn else "normal")


class ChargeTerms(NamedTuple):
    """The terms a caller's topology gives a scope, sent with every charge: a block it would
    charge refuses it unless it keeps the same accounting and period length and no larger cap."""

    accounting: str
    cap_units: int
    period_s: int


class RawCharge(NamedTuple):
    """What the reserve step returns, before it is typed (a tuple: one is built per charge)."""

    outcome: str
    payload: bytes
    reason: str
    spent_units: int
    cap_units: int
    state: str
    cost_units: int


class View(NamedTuple):
    """What the backend read for one charge, in the same atomic step as it applies the decision."""

    config: Mapping[str, str]
    breaker: Mapping[str, str]
    blocks: Mapping[str, Mapping[str, str]]
    """Every stored period block by period id (a block not opened yet is absent or has no `cap`)."""
    starts: Mapping[str, int]
    """Every opened block's start (the `periods` zset): a new block must not overlap another length."""
    known: bytes | None
    """The stored payload of the release id, if it is known."""


class Charge(NamedTuple):
    """What the caller asks: the request, in units, with its topology's digest and terms."""

    req: ReleaseRequest
    cost: int
    delta: int
    period_start: int
    digest: str
    terms: ChargeTerms
    expired: bool
    now_ms: int


class Decision(NamedTuple):
    """The answer and the writes that go with it, in the order the backend makes them: blocks
    opened, counters added, the breaker, the release and its `ends` entries, then the audit."""

    answer: RawCharge
    opened: tuple[tuple[str, int, dict[str, str]], ...] = ()
    """(period id, start, terms) of each block to open (the `periods` index and the block's terms)."""
    charged: tuple[str, ...] = ()
    """The periods charged (granted): each adds the cost to `spent`, the δ to `delta_spent`, 1 to
    `granted` and `version`, and takes the release in the metric's `ends` at its window end."""
    refused_in: str | None = None
    """The period whose `refused` counter counts this refusal."""
    breaker_drop_auto: bool = False
    """Drop the automatic open (before `breaker_set`)."""
    breaker_set: Mapping[str, str] | None = None
    """Breaker fields to set: an automatic open, which also adds 1 to its period's `version`."""
    audit: tuple[dict[str, str], ...] = ()
    release: dict[str, str | bytes] | None = None
    """The release hash to store (granted only); it joins the pending set at `now_ms`."""


class _Period(NamedTuple):
    """One period block as the decision reads it: its terms (its own once opened, else the config's)."""

    pid: str
    start: int
    cap_s: str
    reserve_s: str
    warn_s: str
    acc: str
    dcap_s: str
    plen_s: str
    opened: bool
    spent: int
    grant: int
    dspent: int
    cap: int
    warn: int


_TERMS = frozenset(("cap", "reserve", "warn", "accounting", "delta_cap", "period_s"))
"""A block's fixed terms (each one the config's until the block holds it)."""
_NO_TERMS = {"accounting": "", "delta_cap": "0", "period_s": ""}
"""Terms neither the block nor the config holds (a config registered before they existed)."""


def _read(view: View, pid: str, start: int) -> _Period:
    """The block `pid`, with the config's terms for any it does not hold yet (charge.lua's `read_period`)."""
    f = view.blocks.get(pid) or _EMPTY
    t = f if f.keys() >= _TERMS else {**_NO_TERMS, **view.config, **f}
    cap_s, warn_s = t["cap"], t["warn"]
    return _Period(
        pid,
        start,
        cap_s,
        t["reserve"],
        warn_s,
        t["accounting"],
        t["delta_cap"],
        t["period_s"],
        "cap" in f,
        int(f.get("spent", 0)),
        int(f.get("grant", 0)),
        int(f.get("delta_spent", 0)),
        int(cap_s),
        int(warn_s),
    )


def audit_entry(kind: str, p: _Period, actor: str, spent: int, fields: Mapping[str, str]) -> dict[str, str]:
    """An audit entry about period `p` at spend `spent`; `fields` add or override (`actor` too),
    empty ones are left out."""
    entry = {"kind": kind, "period": p.pid, "spent": str(spent), "ratio": "%.6f" % (spent / p.cap), "actor": actor}
    for name, value in fields.items():
        if value != "" or name in _ALWAYS:
            entry[name] = value
    return entry


class _Run:
    """One decision under way: the view, the charge, and the writes collected so far."""

    def __init__(self, view: View, c: Charge) -> None:
        req = c.req
        self.view, self.c, self.req = view, c, req
        self.periods = [_read(view, req.period_id, c.period_start)]
        for pid, start in req.extra_periods:
            self.periods.append(_read(view, pid, int(start)))
        br = view.breaker
        self.manual = br.get("manual") == "1"
        self.auto = br.get("auto_period")
        self.auto_touched = None
        for p in self.periods:
            if p.pid == self.auto:
                self.auto_touched = p
        self.opened: list[tuple[str, int, dict[str, str]]] = []
        self.audit: list[dict[str, str]] = []
        self.drop_auto = False

    def entry(self, kind: str, p: _Period, **fields: str) -> None:
        self.audit.append(audit_entry(kind, p, self.req.actor, p.spent, fields))

    def touch(self, p: _Period) -> None:
        """Open `p`'s block with the terms it keeps for its whole life, if it is not opened yet."""
        if p.pid in self.view.starts:
            return
        terms = {
            "cap": p.cap_s,
            "reserve": p.reserve_s,
            "warn": p.warn_s,
            "accounting": p.acc,
            "delta_cap": p.dcap_s,
            "start": str(p.start),
            "period_s": str(self.c.terms.period_s),
        }
        self.opened.append((p.pid, p.start, terms))
        state = _state(p.spent, p.warn, self.manual)
        self.entry("period", p, reason="period block opened", actor="ledger", state=state)

    def done(
        self,
        answer: RawCharge,
        *,
        charged: tuple[str, ...] = (),
        refused_in: str | None = None,
        breaker_set: Mapping[str, str] | None = None,
        release: dict[str, str | bytes] | None = None,
    ) -> Decision:
        """The decision: `answer`, the writes given, and the blocks, breaker drop and audit collected."""
        opened, audit = tuple(self.opened), tuple(self.audit)
        return Decision(answer, opened, charged, refused_in, self.drop_auto, breaker_set, audit, release)

    def close_stale_auto(self) -> None:
        """An automatic open of an earlier period, which this window does not touch, ends (rollover)."""
        main, br = self.periods[0], self.view.breaker
        if self.auto is None or self.auto_touched is not None or int(br["auto_start"]) >= main.start:
            return
        self.drop_auto = True
        reason = f"period rollover: automatic open of {self.auto} ends"
        state = _state(main.spent, main.warn, self.manual)
        self.entry("breaker_close", main, reason=reason, actor="ledger", state=state)

    def refuse(self, p: _Period, reason: str, open_now: bool = False) -> Decision:
        """Refused in period `p`: counted and audited, and the breaker opened automatically when the
        cap itself ran out (`open_now`; no breaker holds the window then, or it was refused before)."""
        c = self.c
        self.touch(p)
        is_open = self.manual or self.auto == p.pid or open_now
        state = _state(p.spent, p.warn, is_open)
        self.entry(
            "refusal",
            p,
            release_id=c.req.release_id,
            metric=c.req.metric,
            cost=str(c.cost),
            delta=str(c.delta),
            reason=reason,
            state=state,
        )
        breaker = None
        if open_now:  # (only a budget refusal opens it, and it comes after both breaker checks)
            breaker = {"auto_period": p.pid, "auto_start": str(p.start), "auto_reason": reason}
            breaker["auto_at"] = str(c.now_ms)
            self.entry("breaker_open", p, reason=reason, actor="ledger", state="open")
        return self.done(
            RawCharge("refused", b"", reason, p.spent, p.cap, state, 0), refused_in=p.pid, breaker_set=breaker
        )

    def where(self, p: _Period) -> str:
        return "" if p is self.periods[0] else f" (in later period {p.pid}, which this window also touches)"

    def conflict(self, p: _Period) -> tuple[_Period, str] | None:
        """The block whose fixed terms are not the caller's: `p` itself once opened, else a block of
        another length that `p` would overlap."""
        terms, plen_s = self.c.terms, str(self.c.terms.period_s)
        if p.opened:
            if p.acc != terms.accounting:
                return p, f"accounting {p.acc}, this worker {terms.accounting}"
            if p.cap > terms.cap_units:
                return p, f"cap {p.cap_s} units, this worker {terms.cap_units} (smaller)"
            if p.plen_s != plen_s:
                return p, f"period {p.plen_s} s, this worker {plen_s} s"
            return None
        index, end = self.view.starts, p.start + terms.period_s
        inside = [(start, b) for b, start in index.items() if p.start <= start < end]
        found = min(inside) if inside else None
        if found is None:
            before = [(start, b) for b, start in index.items() if start < p.start]
            if before:
                start, b = max(before)
                length = (self.view.blocks.get(b) or _EMPTY).get("period_s", self.view.config.get("period_s", "0"))
                if start + int(length) > p.start:
                    found = (start, b)
        if found is None or found[1] == p.pid:
            return None
        q = _read(self.view, found[1], found[0])
        return q, f"period {q.plen_s} s, this worker {plen_s} s, whose period {p.pid} overlaps it"

    def refusal(self) -> Decision | None:
        """The first reason to refuse, in charge.lua's order (None: granted)."""
        c, cfg, main, br = self.c, self.view.config, self.periods[0], self.view.breaker
        if c.digest != cfg.get("digest"):
            return self.refuse(
                main,
                f"topology disagrees with the scope's registered terms (digest {cfg.get('digest', '?')}, "
                f"this worker {c.digest}): restart it with the current topology",
            )
        for p in self.periods:
            clash = self.conflict(p)
            if clash is not None:
                q, what = clash
                return self.refuse(
                    q,
                    f"period terms differ: block {q.pid} keeps {what}: a period keeps the terms it opened with; "
                    "release its windows under those terms, or use a new scope name",
                )
        if self.manual:
            return self.refuse(main, "breaker open (manual): " + br.get("manual_reason", ""))
        auto = self.auto_touched
        if auto is not None:
            return self.refuse(auto, "breaker open (automatic): " + br.get("auto_reason", "") + self.where(auto))
        for p in self.periods:
            refused = self.budget_refusal(p)
            if refused is not None:
                return refused
        return None

    def budget_refusal(self, p: _Period) -> Decision | None:
        """Period `p` cannot take the cost: its cap (which opens the breaker), its pool outside the
        reserve, or its selection δ."""
        cost, delta = self.c.cost, self.c.delta
        if p.spent + cost > p.cap:
            left = p.cap - p.spent
            return self.refuse(
                p, f"budget exhausted: cost {cost} exceeds the {left} units left of the cap" + self.where(p), True
            )
        limit = p.cap - int(p.reserve_s) + p.grant
        if self.req.may_use_reserve or limit > p.cap:
            limit = p.cap
        if p.spent + cost > limit:
            return self.refuse(
                p,
                f"pool exhausted: cost {cost} exceeds the {max(0, limit - p.spent)} units left outside the reserve "
                "(only may_use_reserve metrics or an operator grant draw on it)" + self.where(p),
            )
        dcap = int(p.dcap_s)
        if p.dspent + delta > dcap:
            return self.refuse(
                p,
                f"selection delta exhausted: delta {delta} exceeds the {max(0, dcap - p.dspent)} units (1e-18) "
                "left of the period's selection delta cap" + self.where(p),
            )
        return None

    def grant(self) -> Decision:
        """Charged in every period the window touches, the release recorded, each charge audited."""
        c, req, periods = self.c, self.req, self.periods
        for p in periods:
            self.touch(p)
        cost_s, delta_s, actor = str(c.cost), str(c.delta), req.actor
        for p in periods:
            spent = p.spent + c.cost
            after = "warning" if spent >= p.warn else "normal"
            ratio = "%.6f" % (spent / p.cap)
            entry = {
                "kind": "charge",
                "period": p.pid,
                "spent": str(spent),
                "ratio": ratio,
                "actor": actor,
                "release_id": req.release_id,
                "metric": req.metric,
                "cost": cost_s,
                "delta": delta_s,
                "state": after,
            }
            self.audit.append(entry)  # (every field is non-empty: no filter needed)
            was = "warning" if p.spent >= p.warn else "normal"
            if after != was:
                fields = {"reason": f"{was} -> {after} at ratio {ratio}", "actor": "ledger", "state": after}
                self.audit.append(audit_entry("state", p, actor, spent, fields))
        main = periods[0]
        spent = main.spent + c.cost
        ratio = "%.6f" % (spent / main.cap)
        payload = bytes(req.payload).replace(RATIO_TOKEN, b'"ratio_after":' + ratio.encode(), 1)
        release: dict[str, str | bytes] = {
            "state": "reserved",
            "period": req.period_id,
            "metric": req.metric,
            "window_start": str(req.window_start),
            "window_end": str(req.window_end),
            "cost": cost_s,
            "delta": delta_s,
            "extra_periods": " ".join([p.pid for p in periods[1:]]),
            "payload": payload,
            "ratio_after": ratio,
            "reserved_at": str(c.now_ms),
        }
        state = "warning" if spent >= main.warn else "normal"
        answer = RawCharge("granted", payload, "", spent, main.cap, state, c.cost)
        return self.done(answer, charged=tuple([p.pid for p in periods]), release=release)


def decide(view: View, c: Charge) -> Decision:
    """What charge.lua decides for this charge on this view: the answer and the writes (see the module doc)."""
    run = _Run(view, c)
    main = run.periods[0]
    state = _state(main.spent, main.warn, run.manual or run.auto == main.pid)
    if view.known is not None:
        return Decision(RawCharge("duplicate", view.known, "", main.spent, main.cap, state, 0))
    if c.expired:
        return Decision(RawCharge("expired", b"", "expired", main.spent, main.cap, state, 0))
    version = int((view.blocks.get(main.pid) or _EMPTY).get("version", 0))
    if c.req.quoted_version is not None and version != c.req.quoted_version:
        reason = f"stale quote: the period's spend version is now {version}"
        return Decision(RawCharge("stale_quote", b"", reason, main.spent, main.cap, state, 0))
    run.close_stale_auto()
    return run.refusal() or run.grant()
