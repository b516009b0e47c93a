"""`topology.schedule.Schedule` against a slow oracle that walks the grid one second at a time.

The oracle enumerates every integer second of a bounded range, keeps the multiples of every_s
(the window starts), applies S and the method's condition literally, and counts: no closed form,
so it cannot share a mistake with the arithmetic under test. Large epoch offsets (multiples of
every_s, which leave the grid unchanged) check the arithmetic at real timestamps too.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.topology.allocation import windows_left
from dpstream.topology.model import Window
from dpstream.topology.schedule import Schedule

LO, HI = -1_500, 1_500
"""Every window start any generated case can involve lies in [LO, HI)."""

T = st.integers(min_value=-900, max_value=900)
"""Times: period starts, S, window ends, horizons."""

G = st.tuples(T, st.sampled_from([None, -1, 0, 0, 1]))
"""A time, or (mode not None) the grid point below it moved by -1, 0 or +1 s: the edges are where counts break."""

Time = tuple[int, int | None]


def at(t: Time, every: int, plus: int = 0) -> int:
    """The drawn time; snapped near a window start (or, with `plus` = size, a window end) by its mode."""
    value, mode = t
    return value if mode is None else value // every * every + plus + mode


@st.composite
def grids(draw: st.DrawFn) -> tuple[int, int]:
    """(size_s, every_s): tumbling, hopping (every divides size) or any size (gaps or overlaps)."""
    every = draw(st.integers(min_value=1, max_value=60))
    kind = draw(st.sampled_from(["tumbling", "hopping", "any"]))
    if kind == "tumbling":
        return every, every
    if kind == "hopping":
        return every * draw(st.integers(min_value=2, max_value=5)), every
    return draw(st.integers(min_value=1, max_value=200)), every


starts_s = st.one_of(
    st.none(),
    T.map(lambda t: ("at", t)),
    st.integers(min_value=-3, max_value=3).map(lambda d: ("near", d)),
)
"""S: none, anywhere (before, inside or after the period), or a second or three from the period start."""

SpecS = tuple[str, int] | None


def resolve(spec: SpecS, anchor: int) -> int | None:
    """S of a drawn spec: absolute, or that many seconds from `anchor` (the period start)."""
    if spec is None:
        return None
    kind, value = spec
    return value if kind == "at" else anchor + value


offsets = st.sampled_from([0, 1_796_000_000, 1_796_083_200, 10**12])
"""Epoch shifts; a case is shifted by the largest multiple of every_s not above one of these."""


def grid_starts(every: int, start: int | None) -> list[int]:
    """Every window start in [LO, HI), one second at a time, none before S."""
    return [s for s in range(LO, HI) if s % every == 0 and (start is None or s >= start)]


def count(every: int, start: int | None, keep: Callable[[int], bool]) -> int:
    return sum(1 for s in grid_starts(every, start) if keep(s))


def shift_of(offset: int, every: int) -> int:
    return offset // every * every


def shifted(start: int | None, d: int) -> int | None:
    return None if start is None else start + d


@settings(max_examples=300)
@given(grids(), starts_s, G, st.integers(min_value=1, max_value=500), G, offsets)
def test_left_counts_windows_of_the_period_ending_at_or_after_the_current_end(
    grid: tuple[int, int], spec: SpecS, p: Time, period_s: int, e: Time, offset: int
) -> None:
    size, every = grid
    period_start, current_end = at(p, every), at(e, every, size)
    start = resolve(spec, period_start)
    want = count(every, start, lambda s: period_start <= s < period_start + period_s and s + size >= current_end)
    d = shift_of(offset, every)
    sched = Schedule(size, every, shifted(start, d))
    assert sched.left(period_start + d, period_s, current_end + d) == want
    window = Window(size, every)
    assert windows_left(window, period_start + d, period_s, current_end + d, shifted(start, d)) == want


@settings(max_examples=300)
@given(grids(), starts_s, G, G, offsets)
def test_starts_in_counts_window_starts_in_the_range_from_s(
    grid: tuple[int, int], spec: SpecS, lo_t: Time, hi_t: Time, offset: int
) -> None:
    size, every = grid
    lo, hi = at(lo_t, every), at(hi_t, every)
    start = resolve(spec, lo)
    want = count(every, start, lambda s: lo <= s < hi)
    d = shift_of(offset, every)
    assert Schedule(size, every, shifted(start, d)).starts_in(lo + d, hi + d) == want


@settings(max_examples=300)
@given(
    grids(),
    starts_s,
    G,
    G,
    st.one_of(st.floats(min_value=-1_000, max_value=1_200), G, st.tuples(T, st.sampled_from([-0.001, 0.5]))),
    offsets,
)
def test_ended_counts_windows_of_the_period_that_have_ended(
    grid: tuple[int, int],
    spec: SpecS,
    p: Time,
    q: Time,
    n: float | Time | tuple[int, float],
    offset: int,
) -> None:
    size, every = grid
    period_start, period_end = at(p, every), at(q, every)
    if isinstance(n, float):
        now = n
    elif isinstance(n[1], float):
        now = n[0] // every * every + size + n[1]  # just before, or between, window ends
    else:
        now = float(at(n, every, size))  # type: ignore[arg-type]  # an int-moded Time
    start = resolve(spec, period_start)
    want = count(every, start, lambda s: period_start <= s < period_end and s + size <= now)
    assert Schedule(size, every, start).ended(period_start, period_end, now) == want
    d = shift_of(offset, every)
    if d and now != int(now):
        now = round(now, 3)  # a float at 1e9+ seconds still holds milliseconds exactly enough
        want = count(every, start, lambda s: period_start <= s < period_end and s + size <= now)
    assert Schedule(size, every, shifted(start, d)).ended(period_start + d, period_end + d, now + d) == want


@settings(max_examples=300)
@given(grids(), starts_s, G, G, offsets)
def test_touching_counts_windows_ending_after_the_period_start_and_by_the_horizon(
    grid: tuple[int, int], spec: SpecS, p: Time, h: Time, offset: int
) -> None:
    size, every = grid
    period_start, horizon = at(p, every), at(h, every, size)
    start = resolve(spec, period_start)
    want = count(every, start, lambda s: s + size > period_start and s + size <= horizon)
    d = shift_of(offset, every)
    assert Schedule(size, every, shifted(start, d)).touching(period_start + d, horizon + d) == want


@given(grids(), T, T, offsets)
def test_first_window_and_first_start_are_the_first_grid_start_not_before_them(
    grid: tuple[int, int], start: int, t: int, offset: int
) -> None:
    size, every = grid
    d = shift_of(offset, every)
    sched = Schedule(size, every, start + d)
    assert sched.first_window() == grid_starts(every, start)[0] + d
    assert sched.first_start_at_or_after(t + d) == grid_starts(every, t)[0] + d


@given(grids(), starts_s, st.one_of(st.none(), T))
def test_starts_walks_the_grid_from_s_and_since(grid: tuple[int, int], spec: SpecS, since: int | None) -> None:
    size, every = grid
    start = resolve(spec, since or 0)
    sched = Schedule(size, every, start)
    if start is None and since is None:
        with pytest.raises(ValueError):
            sched.starts(since)
        return
    want = [s for s in grid_starts(every, start) if since is None or s >= since][:5]
    assert list(itertools.islice(sched.starts(since), 5)) == want


@given(grids(), starts_s, st.integers(min_value=LO, max_value=HI), st.integers(min_value=0, max_value=300))
def test_on_grid_is_size_and_alignment_only(grid: tuple[int, int], spec: SpecS, s: int, length: int) -> None:
    size, every = grid
    start = resolve(spec, s)
    assert Schedule(size, every, start).on_grid(s, s + length) == (length == size and s % every == 0)


def test_first_window_needs_a_deployment_start() -> None:
    with pytest.raises(ValueError):
        Schedule(60, 60).first_window()


@settings(max_examples=50)
@given(T, T, st.floats(min_value=-1_000, max_value=1_000), st.integers(min_value=-3, max_value=0))
def test_a_grid_without_a_step_or_size_counts_nothing_where_it_never_did(
    lo: int, hi: int, now: float, bad: int
) -> None:
    """`starts_in` and `ended` (the plan gauges') count nothing on a degenerate grid, as they always did."""
    assert Schedule(60, bad).starts_in(lo, hi) == 0
    assert Schedule(60, bad, lo).ended(lo, hi, now) == 0
    assert Schedule(bad, 60).ended(lo, hi, now) == 0


def test_of_reads_the_metric_window() -> None:
    sched = Schedule.of_window(Window(7200, 3600), 1_000)
    assert sched == Schedule(7200, 3600, 1_000)
    assert Schedule.of_window(Window(60, 60)) == Schedule(60, 60, None)
