"""Tests of topology.durations."""

import pytest

from dpstream.topology.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    "text,seconds", [("30s", 30), ("5m", 300), ("1h", 3600), ("1d", 86400), (" 15m ", 900), (7, 7)]
)
def test_parse_duration_accepts_units(text, seconds):
    """Every unit suffix parses to whole seconds."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5x", "-1m", "0s", "1.5h", True, 0, "m5"])
def test_parse_duration_rejects_malformed(text):
    """Anything but a positive integer with a unit is refused with the accepted forms named."""
    with pytest.raises(ValueError, match="e.g. 30s, 5m, 1h, 1d"):
        parse_duration(text)


@pytest.mark.parametrize("seconds,text", [(86400, "1d"), (3600, "1h"), (300, "5m"), (90, "90s"), (7200, "2h")])
def test_format_duration_round_trips(seconds, text):
    """The shortest exact spelling parses back to the same number of seconds."""
    assert format_duration(seconds) == text
    assert parse_duration(format_duration(seconds)) == seconds
