"""Neighbouring streams through `dpstream replay` (DESIGN §1 "Stream semantics", §3 "Closing a window").

D is an ordinary stream; D′ is D plus every event of one adversarial unit, with odd timestamps
(far future, 1970, before --from, out of order, on window edges), many keys (declared and not),
values far outside the bounds and bursts, interleaved at random positions in the file. Both run
through `replay_lines` over the same public [start, end) and the same partition count, and:

1. the release_ids are the same (rule 2: the schedule is public; nothing appears, nothing is
   skipped because of the adversary);
2. every released value moves by at most the metric's declared sensitivity in the windows that
   hold an event of the unit, and by nothing but noise in every other window (rule 1: one unit's
   timestamp never moves anyone else's events), plus a noise margin k·√(σ_D² + σ_D′²) with k from
   a sub-Gaussian tail and a union bound over every comparison of this file (`_K`);
3. the data-independent series the budget collector serves from each side's ledger are identical,
   sample by sample, half-way through each budget period and after every P(w) (`nb.replay_series`).

Noise is the production CSPRNG noise (not seeded); only the synthetic D uses a seeded RNG. The
topology's budget is huge (σ ≈ 0.4 for a count) so a sensitivity violation shows above the noise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpstream.workers.release.record import iso_utc, publish_time_of
from tests.privacy import _neighbours as nb

START = nb.T0
END = nb.T0 + 2 * nb.HOUR
D_SEEDS = (1, 2)
"""D is one of these synthetic streams (each replayed once per partition count and cached)."""
PARTITIONS = (1, 3)
MAX_EXAMPLES = 20
"""Per partition count; sized so the file runs in about a minute on 2 busy cores (see the report)."""
ALIAS = 7
"""The adversary may write its id as the integer 7: the parser reads it as unit "7" (workers/pipeline/events.py:
an integer unit becomes its decimal string), so it is D's heavy unit "7", not a new one."""

# -- the noise margin: k from the number of comparisons this file can make ------------------------
_RELEASES, _VALUES_PER_PAIR = nb.schedule_size(nb.topology(), START, END)
_PAIRS = (
    2 * len(PARTITIONS) * MAX_EXAMPLES  # hypothesis examples, ×2: saved examples replayed from its database
    + 2 * 2 * len(PARTITIONS)  # the deterministic tests: 2 tests × (1 comparison + 1 spare) × partitions
)
_K = nb.noise_k(_PAIRS * _VALUES_PER_PAIR, false_failure=1e-6)
"""≈ 7.1: P(any |noise difference| > k·s in this file) ≤ 2·exp(−k²/2) × comparisons ≤ 1e-6."""


@cache
def _base(seed: int, partitions: int, drop_unit: str | None = None) -> tuple[dict[str, dict], list[nb.Series]]:
    """Replay of D (or of D without one unit) and its budget series: the same D serves many examples
    (its noise is one draw; the union bound does not need independence between comparisons)."""
    events = nb.ordinary_stream(seed, START, END)
    if drop_unit is not None:
        events = nb.without_unit(events, drop_unit)
    return nb.replay_series(nb.topology(), nb.to_lines(events), START, END, partitions)


def _series_problems(base: list[nb.Series], neighbour: list[nb.Series]) -> list[str]:
    """Samples of the data-independent series that differ between D and D′, at any scrape instant."""
    instants = nb.scrape_instants(nb.topology(), START, END)
    assert len(base) == len(neighbour) == len(instants) >= 3
    assert nb.spent_somewhere(base[-1]), "the ledger of D shows no spend: nothing compared"
    pairs = zip(instants, base, neighbour, strict=True)
    return [p for at, a, b in pairs for p in nb.compare_series(a, b, f"at {nb.iso(at)}: ")]


# -- the adversary ------------------------------------------------------------------------------
@dataclass(frozen=True)
class AdvEvent:
    position: int
    line: Any
    """A JSON object, or raw bytes for a malformed line."""
    time: float
    """The event time the parser reads from what was written (for the per-window bound)."""


_DAY = 86_400
_WINDOW_EDGES = st.builds(
    lambda n, off: START + 60 * n + off,
    st.integers(0, (END - START) // 60),
    st.sampled_from([0.0, -0.001, -1e-6, 59.999, 0.001]),
)
_TIMES = st.one_of(
    st.floats(END, END + 30 * _DAY),  # far future: hours to days after the range
    st.floats(END + 2_999, END + 3_001),
    st.floats(0, 1_000_000),  # 1970
    st.floats(START - 30 * _DAY, START - 0.001),  # before --from
    st.floats(START, END, exclude_max=True),  # inside, at random (out of order) positions
    _WINDOW_EDGES,  # start, end − ε, end of windows and of the range
    st.sampled_from([float(START), END - 0.001, float(END), START - 0.001]),
)
_PAGES = st.one_of(
    st.sampled_from(nb.DECLARED_PAGES),
    st.just(42),  # an integer key: read as "42", a declared key
    st.integers(0, 10_000),  # undeclared integer keys
    st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6),  # undeclared keys
    st.none(),  # no page field
)
_REFS = st.one_of(st.text("abcdefghij0123456789", min_size=1, max_size=8), st.none())  # data-derived keys
_AMOUNTS = st.one_of(
    st.floats(-1e12, 1e12),
    st.integers(-(10**9), 10**9),
    st.sampled_from([-5, 20, -5.000001, 20.000001, 1e15, -1e15]),
    st.none(),
)


def _written(t: float, fmt: str) -> tuple[Any, float]:
    """(what goes in the `ts` field, the time the parser reads from it): epoch s, ms (≥ 1e11 is
    read as ms, below as seconds), or ISO-8601 UTC."""
    if fmt == "int":
        return int(t), float(int(t))
    if fmt == "ms":
        ms = round(t * 1000)
        return ms, ms / 1000.0 if ms >= 100_000_000_000 else float(ms)
    if fmt == "iso":
        t = round(t, 3)
        return nb.iso(t), t
    t = round(t, 3)
    return t, t


@st.composite
def adversaries(draw: st.DrawFn, d_len: int) -> tuple[Any, list[AdvEvent]]:
    """(the adversary's unit id as written, its events), each at a random position of D's file."""
    unit = draw(st.sampled_from(["adversary", 100_000, "7 ", ALIAS]))
    positions = st.integers(0, d_len)
    fmts = st.sampled_from(["float", "int", "ms", "iso"])
    out: list[AdvEvent] = []

    def event(t: float, page: Any, ref: Any, amount: Any, fmt: str, pos: int, malformed: int = 0) -> None:
        ts, eff = _written(t, fmt)
        obj: dict[str, Any] = {"user_id": unit, "ts": ts}
        for name, v in (("page", page), ("ref", ref), ("amount", amount)):
            if v is not None:
                obj[name] = v
        if malformed == 1:
            obj["amount"] = "lots"  # present but not a number: the whole event is dead-lettered
        line: Any = obj
        if malformed == 2:
            line = json.dumps(obj).encode()[:-3]  # cut short: not JSON
        out.append(AdvEvent(pos, line, eff))

    for _ in range(draw(st.integers(1, 40))):
        event(
            draw(_TIMES),
            draw(_PAGES),
            draw(_REFS),
            draw(_AMOUNTS),
            draw(fmts),
            draw(positions),
            malformed=max(0, draw(st.integers(-17, 2))),
        )
    for _ in range(draw(st.integers(0, 3))):  # bursts: many events in one window, many keys
        t0 = draw(st.one_of(st.floats(START, END - 60), _WINDOW_EDGES, st.floats(END, END + 2 * _DAY)))
        n = draw(st.integers(10, 150))
        pages = draw(st.lists(_PAGES, min_size=1, max_size=12))
        amount = draw(_AMOUNTS)
        at = draw(positions)
        spread = draw(st.sampled_from([0.0, 0.01, 0.3]))
        for j in range(n):
            pos = at + j if draw(st.booleans()) else draw(positions)
            event(t0 + spread * j, pages[j % len(pages)], f"r{j}", amount, "float", pos)
    return unit, out


@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
@pytest.mark.parametrize("partitions", PARTITIONS)
def test_one_unit_moves_releases_by_at_most_its_bound(partitions: int, data: st.DataObject) -> None:
    """D′ = D + one adversarial unit: same release_ids; values within the declared sensitivity
    where the unit has events and within noise elsewhere (DESIGN §1 stream rules 1–3); the same
    data-independent series, sample for sample."""
    seed = data.draw(st.sampled_from(D_SEEDS), label="D seed")
    d_events = nb.ordinary_stream(seed, START, END)
    unit, adv = data.draw(adversaries(len(d_events)), label="adversary")
    alias = unit == ALIAS
    if alias:
        # Unit 7 = D's unit "7": D′ holds all of "7"'s events (D's and the adversary's) and is a
        # neighbour of D without "7", so that is the baseline; if the pipeline bounded 7 and "7"
        # separately the heavy unit could contribute twice its bound.
        base, base_series = _base(seed, partitions, nb.HEAVY)
        times = [e["ts"] for e in d_events if e["user_id"] == nb.HEAVY] + [a.time for a in adv]
    else:
        base, base_series = _base(seed, partitions)
        times = [a.time for a in adv]
    lines = nb.to_lines(nb.interleave(d_events, [(a.position, a.line) for a in adv]))
    neighbour, series = nb.replay_series(nb.topology(), lines, START, END, partitions)
    problems = nb.compare(nb.topology(), base, neighbour, _K, unit_times=times)
    problems += _series_problems(base_series, series)
    assert not problems, f"unit {unit!r}, {len(adv)} events, partitions={partitions}:\n" + "\n".join(problems[:20])


# -- part 1b: the two headline attacks, deterministic ------------------------------------------------
def _dense(first: int, last: int, units: int = 40) -> list[dict]:
    """Every unit once a minute in [first, last): ~40 per window, far above the noise margin."""
    return [
        {
            "user_id": f"d{u}",
            "ts": t + u * 0.5,
            "page": nb.DECLARED_PAGES[(u + t // 60) % 3],
            "ref": "google",
            "amount": u % 12,
        }
        for t in range(first, last, 60)
        for u in range(units)
    ]


@cache
def _dense_base(first: int, last: int, partitions: int) -> tuple[dict[str, dict], list[nb.Series]]:
    return nb.replay_series(nb.topology(), nb.to_lines(_dense(first, last)), START, END, partitions)


@pytest.mark.parametrize("partitions", PARTITIONS)
def test_a_far_future_event_changes_no_other_window(partitions: int) -> None:
    """(a) One event timed 3,000 s after every other event, in the middle of the file: no other
    window changes (an event-time watermark would have closed everyone's windows 50 minutes early
    and dropped the rest of the file as late); the data-independent series are the same."""
    events = _dense(START, START + nb.HOUR)
    t_adv = max(e["ts"] for e in events) + 3_000
    assert t_adv < END
    adv = {"user_id": "adversary", "ts": t_adv, "page": "home", "ref": "x", "amount": 20}
    lines = nb.to_lines(nb.interleave(events, [(len(events) // 3, adv)]))
    neighbour, series = nb.replay_series(nb.topology(), lines, START, END, partitions)
    base, base_series = _dense_base(START, START + nb.HOUR, partitions)
    problems = nb.compare(nb.topology(), base, neighbour, _K, unit_times=[t_adv])
    problems += _series_problems(base_series, series)
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("partitions", PARTITIONS)
def test_an_event_in_the_first_minute_changes_no_release_id(partitions: int) -> None:
    """(b) D starts half an hour into the range; one adversarial event in its first minute adds no
    release (the schedule starts at --from, not at the first event), changes no other window and
    no data-independent series."""
    events = _dense(START + 1_800, START + 2 * nb.HOUR)
    t_adv = START + 17.0
    adv = {"user_id": "adversary", "ts": t_adv, "page": "cart", "ref": "x", "amount": -5}
    lines = nb.to_lines(nb.interleave(events, [(0, adv)]))
    neighbour, series = nb.replay_series(nb.topology(), lines, START, END, partitions)
    base, base_series = _dense_base(START + 1_800, START + 2 * nb.HOUR, partitions)
    problems = nb.compare(nb.topology(), base, neighbour, _K, unit_times=[t_adv])
    problems += _series_problems(base_series, series)
    assert not problems, "\n".join(problems[:20])


def _heavy_unit(events: int, t0: float) -> list[dict]:
    """One adversarial unit with `events` events in one minute (capped to its bound in every window,
    but each event still has to be read, parsed and bounded: processing grows with them)."""
    return [
        {
            "user_id": "heavy",
            "ts": t0 + (i % 6000) / 100,
            "page": nb.DECLARED_PAGES[i % 4],
            "ref": f"r{i % 7}",
            "amount": 20,
        }
        for i in range(events)
    ]


def test_one_heavy_unit_changes_no_public_byte_but_the_noisy_values() -> None:
    """D′ = D + one unit with 20,000 events: every record field but the noisy values is identical
    (costs, ratio_after, published_at), published_at is P(w) = end + allowed_lateness +
    publish_delay, and so is the Kafka record timestamp the release agent gives it; the
    data-independent series served from the two ledgers are identical."""
    topo = nb.topology()
    d_events = nb.ordinary_stream(D_SEEDS[0], START, END)
    heavy = _heavy_unit(20_000, START + 600.0)
    base, base_series = nb.run_replay_raw(topo, nb.to_lines(d_events), START, END, 1)
    neighbour, series = nb.run_replay_raw(
        topo, nb.to_lines(nb.interleave(d_events, [(len(d_events) // 2, e) for e in heavy])), START, END, 1
    )
    assert _series_problems(base_series, series) == []
    assert set(base) == set(neighbour) and len(base) == _RELEASES
    for rid, raw in base.items():
        a, b = nb.public_fields(raw), nb.public_fields(neighbour[rid])
        assert a == b, f"{a['metric']} window {a['window']['start']}: public fields differ"
        metric = topo.metrics[a["metric"]]
        p_w = topo.publish_time(metric, a["window"]["end_epoch"])
        assert a["published_at"] == iso_utc(p_w), (a["metric"], a["window"]["start"])
        assert publish_time_of(raw) == publish_time_of(neighbour[rid]) == p_w  # the Kafka timestamp, ÷ 1000


# -- the harness itself -----------------------------------------------------------------------------
def test_the_whole_schedule_is_published_and_the_bounds_are_the_declared_ones() -> None:
    """Every window of every metric in [start, end) is published for D (nothing refused, so rule 2
    is checked on the whole schedule), and the bounds used here agree with topology.sensitivity."""
    recs, _series = _base(D_SEEDS[0], 1)
    assert len(recs) == _RELEASES
    for m in nb.topology().metrics.values():
        if m in nb.compared_metrics(nb.topology()):
            bound = nb.declared_bound(m)
            assert (bound.linf, bound.l1) == nb.topology_sensitivity(m), m.name
    assert 6.5 < _K < 8.0


def test_a_record_differing_outside_its_values_is_a_problem() -> None:
    """The comparison's positive control: a release whose ratio_after (or any field but its noisy
    values) differs between D and D′ is reported, one whose values alone differ is not."""
    base, _ = _dense_base(START, START + nb.HOUR, 1)
    rid = sorted(base)[0]
    values_only = {**base, rid: {**base[rid], "values": {k: v + 1.0 for k, v in base[rid]["values"].items()}}}
    budget = {**base[rid]["budget"], "ratio_after": base[rid]["budget"]["ratio_after"] + 1e-6}
    ratio = {**base, rid: {**base[rid], "budget": budget}}
    assert nb.field_differences(base, values_only) == []
    assert [line.split(": fields ")[1][:10] for line in nb.field_differences(base, ratio)] == ["['budget']"]
