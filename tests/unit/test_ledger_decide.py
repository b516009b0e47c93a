"""The charge decision (`ledger.decision.decide`) against slow reference models written here.

Two oracles: one judges a single decision on a random view (the outcome, the refusing period,
and that the writes fit the outcome); the other replays random sequences of charges, grants,
breaker actions and clock steps on the in-process ledger and tracks spend, versions, the
breaker and the known releases itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Accounting
from dpstream.topology.periods import period_id, period_start, periods_touched
from dpstream.workers.ledger import Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.allocation import Snapshot, room
from dpstream.workers.ledger.base import budget_left
from dpstream.workers.ledger.decision import Charge, ChargeTerms, Decision, View, decide
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology
from dpstream.workers.ledger.types import fill_ratio
from dpstream.workers.ledger.units import cost_to_units

HOUR = 3_600
P0 = 1_796_083_200  # 2026-12-01T00:00Z
PIDS = [period_id(HOUR, P0 + k * HOUR) for k in range(4)]
CAP, RESERVE, WARN, DCAP = 1_000, 200, 800, 5
CONFIG = {
    "cap": str(CAP),
    "reserve": str(RESERVE),
    "warn": str(WARN),
    "accounting": "pure",
    "delta_cap": str(DCAP),
    "period_s": str(HOUR),
    "digest": "d1",
}
TERMS = ChargeTerms("pure", CAP, HOUR)
RECORD = b'{"release_id":"%s","budget":{"ratio_after":null}}'
"""A release record, its id to fill in (`%`)."""


# ---- one decision on a random view ------------------------------------------------------------


def _rarely(draw: Any) -> bool:
    """True about one time in eight (hypothesis leans to small integers, so 7 is the rare one)."""
    return bool(draw(st.integers(0, 7)) == 7)


@st.composite
def _views(draw: Any) -> tuple[View, Charge]:
    """A view of up to three opened blocks (a few with other terms, or an older block of another
    length), a breaker, and one charge of the first or second period (straddling into the next at
    random), priced near the edges of the cap, the pool and the selection δ."""
    blocks: dict[str, dict[str, str]] = {}
    starts: dict[str, int] = {}
    for k in range(3):
        if draw(st.booleans()):
            block = dict(CONFIG, start=str(P0 + k * HOUR))
            del block["digest"]
            block["spent"] = str(draw(st.integers(0, CAP)))
            block["grant"] = str(draw(st.integers(0, RESERVE)))
            block["delta_spent"] = str(draw(st.integers(0, DCAP)))
            block["version"] = str(draw(st.integers(0, 3)))
            if _rarely(draw):
                other = draw(st.sampled_from(["accounting", "cap", "period_s"]))
                block[other] = {"accounting": "zcdp", "cap": str(CAP + 1), "period_s": "60"}[other]
            blocks[PIDS[k]] = block
            starts[PIDS[k]] = P0 + k * HOUR
    if PIDS[0] not in blocks and _rarely(draw):  # a two-hour block of an older length, over PIDS[0]
        blocks["x"] = dict(CONFIG, period_s=str(2 * HOUR), start=str(P0 - HOUR))
        starts["x"] = P0 - HOUR
    breaker: dict[str, str] = {}
    if _rarely(draw):
        breaker = {"manual": "1", "manual_reason": "ops"}
    elif draw(st.booleans()):
        k = draw(st.integers(0, 2))
        breaker = {"auto_period": PIDS[k], "auto_start": str(P0 + k * HOUR), "auto_reason": "cap", "auto_at": "1"}
    main = draw(st.integers(0, 1))
    extra = ((PIDS[main + 1], P0 + (main + 1) * HOUR),) if draw(st.booleans()) else ()
    version = int(blocks.get(PIDS[main], {}).get("version", 0))
    quoted = draw(st.sampled_from([version, None, version + 1]))
    may_use = draw(st.booleans())
    req = ReleaseRequest(
        "r1", "s", PIDS[main], "m", P0 + main * HOUR + 600, P0 + main * HOUR + 1200, 0.0, RECORD % b"r1"
    )
    req = req._replace(may_use_reserve=may_use, extra_periods=extra, quoted_version=quoted)
    known = b"first bytes" if _rarely(draw) else None
    view = View(CONFIG, breaker, blocks, starts, known)
    edge = draw(st.sampled_from([touched for touched, _ in [(PIDS[main], 0), *extra]]))
    block = blocks.get(edge, {})
    spent, grant = int(block.get("spent", 0)), int(block.get("grant", 0))
    limit = draw(st.sampled_from([CAP, CAP - RESERVE + grant, CAP - RESERVE]))
    cost = max(1, limit - spent + draw(st.integers(-2, 2)))
    delta = max(0, DCAP - int(block.get("delta_spent", 0)) + draw(st.integers(-3, 1)))
    digest = "d0" if _rarely(draw) else "d1"
    return view, Charge(req, cost, delta, P0 + main * HOUR, digest, TERMS, _rarely(draw), 5_000)


def _field(view: View, pid: str, name: str) -> str:
    """A block's term, the config's while the block does not hold it."""
    block = view.blocks.get(pid, {})
    return block[name] if name in block else view.config[name]


def _count(view: View, pid: str, name: str) -> int:
    return int(view.blocks.get(pid, {}).get(name, 0))


def _expected(view: View, c: Charge) -> tuple[str, str, set[str]]:
    """The outcome, the reason's opening words and the periods it may be counted in, from the rules
    as DESIGN states them, one by one."""
    req = c.req
    if view.known is not None:
        return "duplicate", "", set()
    if c.expired:
        return "expired", "expired", set()
    if req.quoted_version is not None and _count(view, req.period_id, "version") != req.quoted_version:
        return "stale_quote", "stale quote", set()
    if c.digest != view.config["digest"]:
        return "refused", "topology disagrees", {req.period_id}
    return _expected_refusal(view, c) or ("charged", "", set())


def _expected_refusal(view: View, c: Charge) -> tuple[str, str, set[str]] | None:
    """Period terms, breakers, then each period's cap, pool and selection δ."""
    req = c.req
    touched = [(req.period_id, c.period_start)] + list(req.extra_periods)
    for pid, start in touched:
        if pid in view.blocks:
            terms = (_field(view, pid, "accounting"), _field(view, pid, "period_s"))
            if terms != ("pure", str(HOUR)) or int(_field(view, pid, "cap")) > CAP:
                return "refused", "period terms differ", {pid}
            continue
        overlapping = {
            b
            for b, s in view.starts.items()
            if b != pid and s < start + HOUR and start < s + int(_field(view, b, "period_s"))
        }
        if overlapping:
            return "refused", "period terms differ", overlapping
    if view.breaker.get("manual") == "1":
        return "refused", "breaker open (manual)", {req.period_id}
    for pid, _ in touched:
        if view.breaker.get("auto_period") == pid:
            return "refused", "breaker open (automatic)", {pid}
    for pid, _ in touched:
        cap, spent = int(_field(view, pid, "cap")), _count(view, pid, "spent")
        if spent + c.cost > cap:
            return "refused", "budget exhausted", {pid}
        reserve = int(_field(view, pid, "reserve"))
        pool = cap if req.may_use_reserve else min(cap, cap - reserve + _count(view, pid, "grant"))
        if spent + c.cost > pool:
            return "refused", "pool exhausted", {pid}
        if _count(view, pid, "delta_spent") + c.delta > int(_field(view, pid, "delta_cap")):
            return "refused", "selection delta exhausted", {pid}
    return None


def _writes_nothing(d: Decision) -> bool:
    return (d.opened, d.charged, d.refused_in, d.breaker_set, d.audit, d.release) == ((), (), None, None, (), None)


@settings(max_examples=600, deadline=None)
@given(_views())
def test_decide_answers_as_the_rules_say_and_writes_only_what_its_outcome_allows(case: tuple[View, Charge]) -> None:
    """Outcome and refusing period as the reference says; answers without a decision write nothing;
    a refusal only counts and audits itself (and opens the breaker when the cap ran out); a grant
    never takes a period past its cap, pool or selection δ, and stores the payload with its ratio."""
    view, c = case
    outcome, reason, where = _expected(view, c)
    d = decide(view, c)
    a = d.answer
    assert (a.outcome, a.reason.startswith(reason)) == (outcome, True), (a, outcome, reason)
    for entry in d.audit:
        assert "" not in entry.values(), entry
    if outcome in ("duplicate", "expired", "stale_quote"):
        assert _writes_nothing(d) and a.cost_units == 0
        assert a.payload == (view.known if outcome == "duplicate" else b"")
        return
    if outcome == "refused":
        assert d.refused_in in where and d.charged == () and d.release is None and a.cost_units == 0
        assert [e["kind"] for e in d.audit].count("refusal") == 1
        assert (d.breaker_set is not None) == (reason == "budget exhausted")
        assert {e["kind"] for e in d.audit} <= {"period", "breaker_close", "refusal", "breaker_open"}
        later = d.refused_in != c.req.period_id and (reason.endswith("exhausted") or "automatic" in reason)
        assert a.reason.endswith(f" (in later period {d.refused_in}, which this window also touches)") == later
        return
    touched = [c.req.period_id] + [pid for pid, _ in c.req.extra_periods]
    assert [p.pid for p in d.charged] == touched and d.refused_in is None and d.breaker_set is None
    for pid in touched:
        block = view.blocks.get(pid, {})
        spent = int(block.get("spent", 0)) + c.cost
        assert spent <= CAP and int(block.get("delta_spent", 0)) + c.delta <= DCAP
        if not c.req.may_use_reserve:
            assert spent <= CAP - RESERVE + int(block.get("grant", 0))
    ratio = (int(view.blocks.get(c.req.period_id, {}).get("spent", 0)) + c.cost) / CAP
    assert d.release is not None and a.payload == d.release["payload"] == fill_ratio(c.req.payload, ratio)
    assert [e["kind"] for e in d.audit].count("charge") == len(touched)
    assert {pid for pid, _, _ in d.opened} == {pid for pid in touched if pid not in view.starts}


@settings(max_examples=300, deadline=None)
@given(st.integers(0, CAP + 3), st.integers(0, CAP), st.booleans())
def test_the_room_pricing_and_status_see_is_what_the_decision_charges(spent: int, grant: int, may_use: bool) -> None:
    """The room a quote is cut to (`allocation.room`) is the largest cost `decide` charges, and the
    status's pool and reserve left (`budget_left`) split it: one pool rule (`decision.spend_limit`)."""
    block = {k: v for k, v in CONFIG.items() if k != "digest"} | {"spent": str(spent), "grant": str(grant)}
    view = View(CONFIG, {}, {PIDS[0]: block | {"start": str(P0)}}, {PIDS[0]: P0}, None)
    req = ReleaseRequest("r1", "s", PIDS[0], "m", P0 + 600, P0 + 1200, 0.0, RECORD % b"r1")
    req = req._replace(may_use_reserve=may_use)

    def charged(cost: int) -> bool:
        return decide(view, Charge(req, cost, 0, P0, "d1", TERMS, False, 5_000)).answer.outcome == "charged"

    snap = Snapshot(CAP, RESERVE, WARN, spent, grant, None, {})
    left = room(snap, may_use)
    assert (left == 0 or charged(left)) and not charged(left + 1)
    pool_left, reserve_left = budget_left(CAP, RESERVE, grant, spent)
    assert (pool_left, pool_left + reserve_left) == (room(snap, False), room(snap, True))


def test_a_decision_on_a_known_release_answers_its_first_bytes_whatever_else_holds() -> None:
    """A known release id wins over an expired window, a stale quote, an open breaker and a spent cap."""
    blocks = {PIDS[0]: dict(CONFIG, spent=str(CAP), version="7")}
    view = View(CONFIG, {"manual": "1"}, blocks, {PIDS[0]: P0}, b"first")
    req = ReleaseRequest("r", "s", PIDS[0], "m", P0, P0 + 60, 0.0, b"{}", quoted_version=3)
    d = decide(view, Charge(req, 5, 0, P0, "d0", TERMS, True, 1))
    assert (d.answer.outcome, d.answer.payload) == ("duplicate", b"first") and _writes_nothing(d)


def test_a_rollover_closes_an_earlier_automatic_open_before_charging() -> None:
    """An automatic open of an earlier period ends with the next period's first charge (audited first)."""
    breaker = {"auto_period": PIDS[0], "auto_start": str(P0), "auto_reason": "cap", "auto_at": "1"}
    view = View(CONFIG, breaker, {}, {}, None)
    req = ReleaseRequest("r", "s", PIDS[1], "m", P0 + HOUR, P0 + HOUR + 60, 0.0, RECORD % b"r")
    d = decide(view, Charge(req, 5, 0, P0 + HOUR, "d1", TERMS, False, 1))
    assert d.answer.outcome == "charged" and d.breaker_drop_auto
    assert [e["kind"] for e in d.audit] == ["breaker_close", "period", "charge"]
    assert d.audit[0]["reason"] == f"period rollover: automatic open of {PIDS[0]} ends"


# ---- sequences on the in-process ledger ------------------------------------------------------------

METRICS = (("a", 1.0, 600, 600, False), ("b", 2.0, 1_200, 600, True))


class _Model:
    """What the ledger must hold after each step, tracked by hand: per period spend, grants and spend
    version, the breaker, and the first payload of every charged release."""

    def __init__(self, cap: int, reserve: int) -> None:
        self.cap, self.reserve = cap, reserve
        self.spent: dict[str, int] = {}
        self.grant: dict[str, int] = {}
        self.version: dict[str, int] = {}
        self.manual = False
        self.auto: tuple[str, int] | None = None
        self.payloads: dict[str, bytes] = {}

    def charge(self, req: ReleaseRequest, units: int) -> tuple[Outcome, str]:
        """The outcome and the reason's opening words (delta is 0: the topology has no selection δ)."""
        if req.release_id in self.payloads:
            return Outcome.DUPLICATE, ""
        main = req.period_id
        if req.quoted_version is not None and self.version.get(main, 0) != req.quoted_version:
            return Outcome.STALE_QUOTE, "stale quote"
        touched = [(main, period_start(HOUR, req.window_start))] + list(req.extra_periods)
        pids = [pid for pid, _ in touched]
        if self.auto is not None and self.auto[0] not in pids and self.auto[1] < touched[0][1]:
            self.auto = None
        if self.manual:
            return Outcome.REFUSED, "breaker open (manual)"
        if self.auto is not None and self.auto[0] in pids:
            return Outcome.REFUSED, "breaker open (automatic)"
        for pid, start in touched:
            spent = self.spent.get(pid, 0)
            if spent + units > self.cap:
                self.auto = (pid, start)
                self.version[pid] = self.version.get(pid, 0) + 1
                return Outcome.REFUSED, "budget exhausted"
            pool = self.cap if req.may_use_reserve else self.cap - self.reserve + self.grant.get(pid, 0)
            if spent + units > min(pool, self.cap):
                return Outcome.REFUSED, "pool exhausted"
        for pid in pids:
            self.spent[pid] = self.spent.get(pid, 0) + units
            self.version[pid] = self.version.get(pid, 0) + 1
        return Outcome.CHARGED, ""

    def granted(self, pid: str, units: int) -> None:
        self.grant[pid] = self.grant.get(pid, 0) + units
        self.version[pid] = self.version.get(pid, 0) + 1
        if self.auto is not None and self.auto[0] == pid:
            self.auto = None


_OPS = st.one_of(
    st.tuples(
        st.just("release"),
        st.integers(0, 1),
        st.integers(0, 17),
        st.sampled_from(["quoted", "quoted", "quoted", "big", "huge"]),
        st.sampled_from(["quoted", "quoted", "stale", "none"]),
    ),
    st.tuples(st.just("grant"), st.sampled_from([0.01, 0.1])),
    st.tuples(st.just("breaker"), st.booleans()),
    st.tuples(st.just("advance"), st.integers(0, 1_800)),
)


async def _replay(ops: list[tuple[Any, ...]]) -> None:
    topo = one_scope_topology(period_s=HOUR, epsilon=1.0, accounting=Accounting.PURE, metrics=METRICS)
    clock = ManualClock(P0 + 100)
    ledger = await open_ledger("memory", topo, clock=clock)
    cfg = ledger.scope_of("a")
    model = _Model(cfg.cap_units, cfg.reserve_units)
    for op in ops:
        if op[0] == "release":
            _, which, slot, cost_mode, version_mode = op
            name, _, size, every, may_use = METRICS[which]
            start = P0 + slot * every
            quote = await ledger.quote(name, start, start + size)
            cost = {"quoted": quote.cost if quote.ok else 0.05, "big": 0.3, "huge": 0.9}[cost_mode]
            version = {"quoted": quote.version, "stale": (quote.version or 0) + 1, "none": None}[version_mode]
            rid = f"{name}-{start}"
            later = tuple((period_id(HOUR, p), p) for p in periods_touched(HOUR, start, start + size)[1:])
            payload = RECORD % rid.encode()
            req = ReleaseRequest(rid, "s", quote.period_id, name, start, start + size, cost, payload, may_use)
            req = req._replace(extra_periods=later, quoted_version=version)
            want, reason = model.charge(req, cost_to_units(cost))
            got = await ledger.charge(req)
            assert (got.outcome, got.reason.startswith(reason)) == (want, True), (op, got)
            if want is Outcome.CHARGED:
                model.payloads[rid] = got.payload
            elif want is Outcome.DUPLICATE:
                assert got.payload == model.payloads[rid]
        elif op[0] == "grant":
            pid = period_id(HOUR, period_start(HOUR, clock()))
            with contextlib.suppress(ConfigError):  # more than is left to grant: nothing written
                model.granted(pid, await ledger.grant_reserve("s", op[1], "test", "op") - model.grant.get(pid, 0))
        elif op[0] == "breaker":
            if op[1]:
                model.manual = model.manual or await ledger.open_breaker("s", "test", "op")
            elif await ledger.close_breaker("s", "test", "op"):
                model.manual, model.auto = False, None
        else:
            clock.advance(op[1])
        for summary in await ledger.history("s", limit=100):
            assert summary.spent_units == model.spent.get(summary.period_id, 0) <= summary.cap_units
            assert summary.grant_units == model.grant.get(summary.period_id, 0)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(_OPS, max_size=40))
def test_random_sequences_never_overspend_and_answer_as_the_model(ops: list[tuple[Any, ...]]) -> None:
    """Releases (duplicates, stale and unchecked quotes, refusals, straddling windows), grants,
    breakers and clock steps: every outcome and every period's spend and grant are the model's;
    spend never passes the cap; a duplicate answers the first payload."""
    asyncio.run(_replay(ops))


def test_a_plain_period_of_releases_is_charged_once_each() -> None:
    """On plan every release of a period is charged once; a retry of the first answers its bytes."""
    ops: list[tuple[Any, ...]] = [("release", 0, slot, "quoted", "quoted") for slot in range(6)]
    asyncio.run(_replay([*ops, ("release", 0, 0, "big", "none")]))
