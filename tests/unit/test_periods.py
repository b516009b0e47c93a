"""Tests of topology.periods: UTC-aligned budget periods, their names, and windows across boundaries."""

from datetime import UTC, datetime

import pytest

from dpstream.topology.errors import InternalError
from dpstream.topology.periods import period_end, period_id, period_ids_touched, period_start, periods_touched

DAY = 86_400
HOUR = 3_600


def _ts(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


def test_daily_period_starts_at_utc_midnight():
    """A 1d period starts at 00:00 UTC of the event's day and ends at the next midnight."""
    ts = _ts(2026, 11, 30, 13, 20, 5)
    assert period_start(DAY, ts) == _ts(2026, 11, 30)
    assert period_end(DAY, ts) == _ts(2026, 12, 1)


def test_period_start_is_inclusive_and_end_exclusive():
    """The first second of a day belongs to that day; the instant before midnight to the previous one."""
    midnight = _ts(2026, 12, 1)
    assert period_start(DAY, midnight) == midnight
    assert period_start(DAY, midnight - 0.001) == _ts(2026, 11, 30)


def test_period_start_of_fractional_and_pre_epoch_times():
    """Fractional seconds floor into the period; times before 1970 still align to multiples of the period."""
    assert period_start(HOUR, _ts(2026, 11, 30, 13) + 3599.999) == _ts(2026, 11, 30, 13)
    assert period_start(DAY, -1.5) == -DAY


def test_period_id_names_days_by_date_and_shorter_periods_by_minute():
    """Whole-day periods are named YYYY-MM-DD; shorter ones by their UTC start to the minute (or second)."""
    ts = _ts(2026, 11, 30, 13, 20, 5)
    assert period_id(DAY, ts) == "2026-11-30"
    assert period_id(HOUR, ts) == "2026-11-30T13:00Z"
    assert period_id(15 * 60, ts) == "2026-11-30T13:15Z"
    assert period_id(5, ts) == "2026-11-30T13:20:05Z"
    assert period_id(7 * DAY, ts) == datetime.fromtimestamp(period_start(7 * DAY, ts), tz=UTC).strftime("%Y-%m-%d")


def test_period_ids_sort_in_time_order():
    """Period ids sort lexicographically in the same order as time (ledger keys rely on it)."""
    times = [_ts(2026, 1, 9, 23), _ts(2026, 1, 10, 0), _ts(2026, 11, 30, 5), _ts(2027, 2, 1)]
    for period in (DAY, HOUR):
        ids = [period_id(period, t) for t in times]
        assert ids == sorted(ids)


def test_window_inside_a_period_touches_one():
    """A window wholly inside a day touches only that day."""
    start = _ts(2026, 11, 30, 12)
    assert periods_touched(DAY, start, start + 300) == (_ts(2026, 11, 30),)


def test_window_ending_exactly_at_midnight_touches_one_period():
    """[23:55, 00:00) ends exactly at midnight: the end is exclusive, so only the earlier day is touched."""
    end = _ts(2026, 12, 1)
    assert period_ids_touched(DAY, end - 300, end) == ("2026-11-30",)


def test_hopping_window_straddling_midnight_touches_two_periods():
    """A 5m window starting at 23:58 holds events of both days, so it is charged to both (DESIGN §3)."""
    start = _ts(2026, 11, 30, 23, 58)
    assert period_ids_touched(DAY, start, start + 300) == ("2026-11-30", "2026-12-01")


def test_long_window_touches_every_period_it_spans():
    """A 3h window over hourly periods starting mid-hour touches four periods."""
    start = _ts(2026, 11, 30, 10, 30)
    assert len(periods_touched(HOUR, start, start + 3 * HOUR)) == 4
    assert period_ids_touched(HOUR, start, start + 3 * HOUR)[-1] == "2026-11-30T13:00Z"


@pytest.mark.parametrize("period", [0, -60, 1.5, True])
def test_bad_period_is_a_bug(period):
    """A non-positive or non-integer period is an internal error (the loader rejects it first)."""
    with pytest.raises(InternalError):
        period_start(period, 0.0)


def test_empty_window_is_a_bug():
    """An empty window [t, t) touches no period and is rejected."""
    with pytest.raises(InternalError):
        periods_touched(DAY, 100.0, 100.0)
