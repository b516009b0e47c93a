"""The charge decision, once, in Python: `decide(view, charge)` → what to answer and what to write.

A pure function of what a backend read (`View`) and what the caller asked (`Charge`): it never
writes; its `Decision` lists the writes (blocks to open, counters to add, breaker changes, audit
entries, the release record), `writes` turns them into ops on the scope's keys, and the backend
applies those: the in-process ledger under its lock (`state.apply_ops`), the Redis ledger with
`lua/apply.lua`, which applies them only if the scope is still where it was decided and checks
the invariants by itself.

Rules, in order: a known release id answers its first stored bytes; an expired window and a
stale quote answer, writing nothing; an automatic breaker open of an earlier period closes; then
the first refusal (topology digest, a block's fixed terms, the breakers, each period's cap,
pool and selection δ) is counted and audited; else every period the window touches is charged.
"""

from __future__ import annotations

__all__ = [
    "View",
    "Charge",
    "ChargeTerms",
    "Decision",
    "RawCharge",
    "AUTO_FIELDS",
    "decide",
    "neighbours",
    "writes",
    "state_of",
    "stale_reason",
    "spend_limit",
]

from collections.abc import Mapping
from itertools import chain
from typing import NamedTuple

from dpstream.workers.ledger import topm
from dpstream.workers.ledger.state import Op
from dpstream.workers.ledger.types import RATIO_TOKEN, ReleaseRequest, State

_EMPTY: Mapping[str, str] = {}

_ALWAYS = ("kind", "period", "spent", "ratio", "actor")
"""Audit fields every charge-time entry carries; other empty fields are left out."""


def state_of(spent_units: int, warn_units: int, is_open: bool) -> State:
    """normal / warning / open, from the spend and the breaker (the one rule)."""
    if is_open:
        return State.OPEN
    return State.WARNING if spent_units >= warn_units else State.NORMAL


def spend_limit(cap: int, reserve: int, grant: int, may_use_reserve: bool) -> int:
    """The most a period's spend may reach with one more charge (the one rule): the whole cap for a
    metric that may use the reserve, else the pool, cap − reserve plus what operators granted of the
    reserve, never above the cap."""
    return cap if may_use_reserve or reserve <= grant else cap - reserve + grant


def _state(spent: int, warn: int, is_open: bool) -> str:
    return state_of(spent, warn, is_open).value


class ChargeTerms(NamedTuple):
    """The terms a caller's topology gives a scope, sent with every charge: a block it would
    charge refuses it unless it keeps the same accounting and period length and no larger cap."""

    accounting: str
    cap_units: int
    period_s: int


class RawCharge(NamedTuple):
    """What the charge step returns, before it is typed (a tuple: one is built per charge)."""

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
    max_windows: int = 0
    """The metric's `contribution.max_windows` (0: none): a period pays only its largest charges (`topm`)."""
    top_field: str = ""
    """The period block's field holding those charges under the caller's topology version (`topm.field`)."""


class Decision(NamedTuple):
    """The answer and the writes that go with it, in the order the backend makes them: blocks
    opened, counters added, the breaker, the release and its `ends` entries, then the audit."""

    answer: RawCharge
    opened: tuple[_OpenBlock, ...] = ()
    """(period id, start, terms) of each block to open (the `periods` index and the block's terms)."""
    charged: tuple[_Paid, ...] = ()
    """The periods charged: each adds what it pays to `spent`, the δ to `delta_spent`, 1 to
    `granted` and `version`, the release to the metric's `ends` at its window end and, under
    `max_windows`, stores the metric's largest charges after it."""
    refused_in: str | None = None
    """The period whose `refused` counter counts this refusal."""
    breaker_drop_auto: bool = False
    """Drop the automatic open (before `breaker_set`)."""
    breaker_set: Mapping[str, str] | None = None
    """Breaker fields to set: an automatic open, which also adds 1 to its period's `version`."""
    audit: tuple[dict[str, str], ...] = ()
    release: dict[str, str | bytes] | None = None
    """The release hash to store (charged only); it joins the pending set at `now_ms`."""


_OpenBlock = tuple[str, int, dict[str, str]]
"""(period id, start, terms) of a block to open."""


class _Paid(NamedTuple):
    """What one period pays for a charge: the units added to its spend and, under `max_windows`,
    the metric's largest charges after it (`topm.raised`; None without the cap)."""

    pid: str
    units: int
    top: tuple[int, ...] | None


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
    version: int
    """The block's spend version (bumped by every charge, grant and automatic open of the period)."""


_TERMS = frozenset(("cap", "reserve", "warn", "accounting", "delta_cap", "period_s"))
"""A block's fixed terms (each one the config's until the block holds it)."""
_NO_TERMS = {"accounting": "", "delta_cap": "0", "period_s": ""}
"""Terms neither the block nor the config holds (a config registered before they existed)."""


def _read(view: View, pid: str, start: int) -> _Period:
    """The block `pid`, with the config's terms for any it does not hold yet."""
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
        int(f.get("version", 0)),
    )


def audit_entry(kind: str, p: _Period, actor: str, spent: int, fields: Mapping[str, str]) -> dict[str, str]:
    """An audit entry about period `p` at spend `spent`; `fields` add or override (`actor` too),
    empty ones are left out."""
    entry = {"kind": kind, "period": p.pid, "spent": str(spent), "ratio": "%.6f" % (spent / p.cap), "actor": actor}
    for name, value in fields.items():
        if value != "" or name in _ALWAYS:
            entry[name] = value
    return entry


def _entry(kind: str, p: _Period, actor: str, /, **fields: str) -> dict[str, str]:
    """An audit entry about period `p` as it stands (`audit_entry` at its spend)."""
    return audit_entry(kind, p, actor, p.spent, fields)


def _opened(
    view: View, c: Charge, periods: list[_Period], manual: bool, entries: list[dict[str, str]]
) -> tuple[_OpenBlock, ...]:
    """The blocks of `periods` not opened yet, with the terms each keeps for its whole life; their
    audit entries go on `entries`."""
    blocks: tuple[_OpenBlock, ...] = ()
    for p in periods:
        if p.pid in view.starts:
            continue
        terms = {
            "cap": p.cap_s,
            "reserve": p.reserve_s,
            "warn": p.warn_s,
            "accounting": p.acc,
            "delta_cap": p.dcap_s,
            "start": str(p.start),
            "period_s": str(c.terms.period_s),
        }
        blocks += ((p.pid, p.start, terms),)
        state = _state(p.spent, p.warn, manual)
        entries.append(_entry("period", p, c.req.actor, reason="period block opened", actor="ledger", state=state))
    return blocks


def _rollover(view: View, periods: list[_Period], manual: bool, actor: str) -> list[dict[str, str]]:
    """An automatic open of an earlier period, which this window does not touch, ends: its audit
    entry (none: nothing to close)."""
    auto, main = view.breaker.get("auto_period"), periods[0]
    if auto is None or any(p.pid == auto for p in periods) or int(view.breaker["auto_start"]) >= main.start:
        return []
    reason = f"period rollover: automatic open of {auto} ends"
    return [
        _entry("breaker_close", main, actor, reason=reason, actor="ledger", state=_state(main.spent, main.warn, manual))
    ]


def _paid(view: View, c: Charge, p: _Period) -> _Paid:
    """What period `p` pays for this charge: its cost, or under `max_windows` what it raises the sum
    of the metric's largest charges by (`topm`)."""
    if not c.max_windows:
        return _Paid(p.pid, c.cost, None)
    stored = (view.blocks.get(p.pid) or _EMPTY).get(c.top_field)
    units, top = topm.raised(topm.parse(stored), c.max_windows, c.cost)
    return _Paid(p.pid, units, top)


def _later(p: _Period, main: _Period) -> str:
    return "" if p is main else f" (in later period {p.pid}, which this window also touches)"


def neighbours(
    starts: Mapping[str, int], start: int, length: int
) -> tuple[tuple[int, str] | None, tuple[int, str] | None]:
    """The (start, id) of the first opened block starting in [start, start + length), and of the
    last one starting before `start`: the blocks a new block there could overlap."""
    inside = [(s, b) for b, s in starts.items() if start <= s < start + length]
    before = [(s, b) for b, s in starts.items() if s < start]
    return (min(inside) if inside else None), (max(before) if before else None)


def _conflict(view: View, c: Charge, p: _Period) -> tuple[_Period, str] | None:
    """The block whose fixed terms are not the caller's: `p` itself once opened, else a block of
    another length that `p` would overlap (blocks never overlap, so the nearest ones tell)."""
    terms, plen_s = c.terms, str(c.terms.period_s)
    if p.opened:
        if p.acc != terms.accounting:
            return p, f"accounting {p.acc}, this worker {terms.accounting}"
        if p.cap > terms.cap_units:
            return p, f"cap {p.cap_s} units, this worker {terms.cap_units} (smaller)"
        if p.plen_s != plen_s:
            return p, f"period {p.plen_s} s, this worker {plen_s} s"
        return None
    inside, before = neighbours(view.starts, p.start, terms.period_s)
    found = inside
    if found is None and before is not None:
        length = (view.blocks.get(before[1]) or _EMPTY).get("period_s", view.config.get("period_s", "0"))
        if before[0] + int(length) > p.start:
            found = before
    if found is None or found[1] == p.pid:
        return None
    q = _read(view, found[1], found[0])
    return q, f"period {q.plen_s} s, this worker {plen_s} s, whose period {p.pid} overlaps it"


def _refusal(view: View, c: Charge, periods: list[_Period]) -> tuple[_Period, str, bool] | None:
    """The first reason to refuse, in the module doc's order: (the period it is counted in, the reason,
    whether it opens the breaker: the cap itself ran out); None: charged."""
    cfg, br, main = view.config, view.breaker, periods[0]
    if c.digest != cfg.get("digest"):
        why = (
            f"topology disagrees with the scope's registered terms (digest {cfg.get('digest', '?')}, "
            f"this worker {c.digest}): restart it with the current topology"
        )
        return main, why, False
    for p in periods:
        clash = _conflict(view, c, p)
        if clash is not None:
            q, what = clash
            why = (
                f"period terms differ: block {q.pid} keeps {what}: a period keeps the terms it opened with; "
                "release its windows under those terms, or use a new scope name"
            )
            return q, why, False
    if br:  # (no breaker field at all: neither check can refuse)
        if br.get("manual") == "1":
            return main, "breaker open (manual): " + br.get("manual_reason", ""), False
        for p in periods:
            if br.get("auto_period") == p.pid:
                return p, "breaker open (automatic): " + br.get("auto_reason", "") + _later(p, main), False
    if c.req.needs_lump and not (view.blocks.get(main.pid) or _EMPTY).get(c.top_field):
        why = (
            "running total: its period's first step was not charged, so no later step of this period is "
            "released (a running total is one lump a period, charged with its first step)"
        )
        return main, why, False
    delta, may_use_reserve = c.delta, c.req.may_use_reserve
    for p in periods:
        spent, cap, cost = p.spent, p.cap, _paid(view, c, p).units
        if spent + cost > cap:
            return (
                p,
                f"budget exhausted: cost {cost} exceeds the {cap - spent} units left of the cap" + _later(p, main),
                True,
            )
        limit = spend_limit(cap, int(p.reserve_s), p.grant, may_use_reserve)
        if spent + cost > limit:
            why = (
                f"pool exhausted: cost {cost} exceeds the {max(0, limit - spent)} units left outside the reserve "
                "(only may_use_reserve metrics or an operator grant draw on it)"
            )
            return p, why + _later(p, main), False
        dcap = int(p.dcap_s)
        if p.dspent + delta > dcap:
            why = (
                f"selection delta exhausted: delta {delta} exceeds the {max(0, dcap - p.dspent)} units (1e-18) "
                "left of the period's selection delta cap"
            )
            return p, why + _later(p, main), False
    return None


def _refuse(view: View, c: Charge, rollover: list[dict[str, str]], refusal: tuple[_Period, str, bool]) -> Decision:
    """Refused in period `p`: its block opened if need be, the refusal counted and audited, and the
    breaker opened automatically when the cap itself ran out (no breaker holds the window then:
    both breaker checks come first)."""
    p, reason, open_now = refusal
    req, br = c.req, view.breaker
    manual = br.get("manual") == "1"
    entries: list[dict[str, str]] = []
    blocks = _opened(view, c, [p], manual, entries)
    is_open = manual or br.get("auto_period") == p.pid or open_now
    state = _state(p.spent, p.warn, is_open)
    fields = {"release_id": req.release_id, "metric": req.metric, "cost": str(c.cost), "delta": str(c.delta)}
    entries.append(_entry("refusal", p, req.actor, **fields, reason=reason, state=state))
    breaker = None
    if open_now:
        breaker = {"auto_period": p.pid, "auto_start": str(p.start), "auto_reason": reason, "auto_at": str(c.now_ms)}
        entries.append(_entry("breaker_open", p, req.actor, reason=reason, actor="ledger", state="open"))
    answer = RawCharge("refused", b"", reason, p.spent, p.cap, state, 0)
    return Decision(answer, blocks, (), p.pid, bool(rollover), breaker, tuple(rollover + entries))


def _grant(view: View, c: Charge, periods: list[_Period], rollover: list[dict[str, str]]) -> Decision:
    """Charged in every period the window touches (blocks opened as needed), the release recorded,
    each period's charge (and state change) audited."""
    req, cost, delta = c.req, c.cost, c.delta
    dropped = bool(rollover)
    entries = rollover  # (this decision's own list: the rollover entry, if any, comes first)
    blocks = _opened(view, c, periods, False, entries)
    delta_s, actor, rid, metric = str(delta), req.actor, req.release_id, req.metric
    main_ratio = ""
    paid = tuple([_paid(view, c, p) for p in periods])
    for p, pays in zip(periods, paid, strict=True):
        spent = p.spent + pays.units
        spent_s = str(spent)
        after = _state(spent, p.warn, False)
        ratio = "%.6f" % (spent / p.cap)
        main_ratio = main_ratio or ratio
        entries.append(
            {
                "kind": "charge",
                "period": p.pid,
                "spent": spent_s,
                "ratio": ratio,
                "actor": actor,
                "release_id": rid,
                "metric": metric,
                "cost": str(pays.units),
                "delta": delta_s,
                "state": after,
            }
        )  # (every field is non-empty: no filter needed)
        if pays.top is not None:  # the release's own cost, beside what the period paid for it
            entries[-1]["release_cost"] = str(cost)
        was = _state(p.spent, p.warn, False)
        if after != was:
            fields = {"reason": f"{was} -> {after} at ratio {ratio}", "actor": "ledger", "state": after}
            entries.append(audit_entry("state", p, actor, spent, fields))
    main, ratio = periods[0], main_ratio
    spent = main.spent + paid[0].units
    payload = bytes(req.payload).replace(RATIO_TOKEN, b'"ratio_after":' + ratio.encode(), 1)
    release: dict[str, str | bytes] = {
        "state": "reserved",
        "period": req.period_id,
        "metric": metric,
        "window_start": str(req.window_start),
        "window_end": str(req.window_end),
        "cost": str(paid[0].units),
        "delta": delta_s,
        "extra_periods": " ".join([p.pid for p in periods[1:]]) if len(periods) > 1 else "",
        "payload": payload,
        "ratio_after": ratio,
        "reserved_at": str(c.now_ms),
    }
    answer = RawCharge("charged", payload, "", spent, main.cap, _state(spent, main.warn, False), paid[0].units)
    return Decision(answer, blocks, paid, None, dropped, None, tuple(entries), release)


def stale_reason(version: int | str) -> str:
    """The reason of a STALE_QUOTE answer: the main period's spend version moved to `version`."""
    return f"stale quote: the period's spend version is now {version}"


def decide(view: View, c: Charge) -> Decision:
    """The answer to this charge on this view, and the writes that go with it (see the module doc)."""
    req = c.req
    periods = [_read(view, req.period_id, c.period_start)]
    for pid, start in req.extra_periods:
        periods.append(_read(view, pid, int(start)))
    main, br, quoted = periods[0], view.breaker, req.quoted_version
    if view.known is not None or c.expired or (quoted is not None and main.version != quoted):
        state = _state(main.spent, main.warn, br.get("manual") == "1" or br.get("auto_period") == main.pid)
        if view.known is not None:
            return Decision(RawCharge("duplicate", view.known, "", main.spent, main.cap, state, 0))
        if c.expired:
            return Decision(RawCharge("expired", b"", "expired", main.spent, main.cap, state, 0))
        reason = stale_reason(main.version)
        return Decision(RawCharge("stale_quote", b"", reason, main.spent, main.cap, state, 0))
    rollover = _rollover(view, periods, br.get("manual") == "1", req.actor) if br else []
    refusal = _refusal(view, c, periods)
    if refusal is not None:
        return _refuse(view, c, rollover, refusal)
    return _grant(view, c, periods, rollover)


AUTO_FIELDS = ("auto_period", "auto_start", "auto_reason", "auto_at")
"""The breaker's automatic open."""


def _flat(fields: Mapping[str, str | bytes]) -> tuple[str | bytes, ...]:
    """(field, value, field, value, ...) of a hash or audit entry."""
    return tuple(chain.from_iterable(fields.items()))


def writes(c: Charge, d: Decision, retention_s: int) -> tuple[Op, ...]:
    """The writes of decision `d` as ops on the scope's keys, in the order the Decision lists them."""
    req, ops = c.req, []
    for pid, start, terms in d.opened:
        ops += [("ZADDNX", ("periods",), (start, pid)), ("HSET", ("period", pid), _flat(terms))]
    for pid, units, top in d.charged:
        block, ends = ("period", pid), ("ends", pid, req.metric)
        if top is not None:
            ops.append(("HSET", block, (c.top_field, topm.text(top))))
        ops += [
            ("HINCRBY", block, ("spent", units, "delta_spent", c.delta, "granted", 1, "version", 1)),
            ("ZADD", ends, (int(req.window_end), req.release_id)),
            ("EXPIRE", ends, (retention_s,)),
        ]
    if d.refused_in is not None:
        ops.append(("HINCRBY", ("period", d.refused_in), ("refused", 1)))
    if d.breaker_drop_auto:
        ops.append(("HDEL", ("breaker",), AUTO_FIELDS))
    if d.breaker_set:
        ops += [
            ("HSET", ("breaker",), _flat(d.breaker_set)),
            ("HINCRBY", ("period", d.breaker_set["auto_period"]), ("version", 1)),
        ]
    if d.release is not None:
        rid = req.release_id
        ops += [
            ("HSET", ("release", rid), _flat(d.release)),
            ("EXPIRE", ("release", rid), (retention_s,)),
            ("ZADD", ("pending",), (c.now_ms, rid)),
        ]
        if req.running_state:  # kept a retention past the period's last step
            running = ("running", req.period_id, c.top_field)
            ops += [
                ("HSET", running, (str(req.window_start), req.running_state)),
                ("EXPIRE", running, (retention_s + c.terms.period_s,)),
            ]
    ops += [("XADD", ("audit",), _flat(entry)) for entry in d.audit]
    return tuple(ops)
