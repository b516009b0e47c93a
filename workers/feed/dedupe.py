"""The dedupe rule of the releases topic, in one place: the first record per release_id wins.

A release is published at least once: the release agent, a restarted worker and the sweeper all
send the ledger's stored bytes for a release_id, so a repeat is byte-identical and dropped. A later
record whose release_id is known but whose bytes differ is a *conflict*: never shown (the first
stays the release), counted per metric, and alarmed (`DPReleaseConflict`). The rule is the same for
`dpstream tail`, the exporter's feed series and any consumer written from the README.
"""

from __future__ import annotations

__all__ = ["Dedupe", "Seen", "Verdict", "parse_record"]

import hashlib
import json
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Verdict(Enum):
    """What the dedupe rule says of one record read from the topic."""

    FIRST = "first"
    """The first record of its release_id: the release."""
    REPEAT = "repeat"
    """The same bytes again (a republish): dropped."""
    CONFLICT = "conflict"
    """A known release_id with other bytes: dropped, counted and alarmed."""
    MALFORMED = "malformed"
    """Not a JSON object with a string release_id and metric: dropped (not a release record)."""


@dataclass(frozen=True, slots=True)
class Seen:
    """One record's verdict, and the record when it is the release (`FIRST`)."""

    verdict: Verdict
    release_id: str | None
    metric: str | None
    record: dict[str, Any] | None = None


def parse_record(payload: bytes) -> dict[str, Any] | None:
    """The record as a dict, or None when the bytes are not a release record (a JSON object with a
    string `release_id` and `metric`)."""
    try:
        record = json.loads(payload)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    if not isinstance(record.get("release_id"), str) or not isinstance(record.get("metric"), str):
        return None
    return record


class Dedupe:
    """The first record per release_id wins; a later one that differs is counted as a conflict.

    Holds a SHA-256 of the first bytes of every release_id seen (about 100 bytes each: a year of
    one-minute windows of one metric is some 50 MB), so a process reading the topic for long keeps
    them all; `conflicts` counts per metric since this object was made."""

    def __init__(self) -> None:
        self._digests: dict[str, bytes] = {}
        self.conflicts: dict[str, int] = {}

    def offer(self, payload: bytes) -> Seen:
        """The verdict on the next record read from the topic (in the order it was read)."""
        record = parse_record(payload)
        if record is None:
            return Seen(Verdict.MALFORMED, None, None)
        release_id, metric = record["release_id"], record["metric"]
        digest = hashlib.sha256(payload).digest()
        known = self._digests.get(release_id)
        if known is None:
            self._digests[release_id] = digest
            return Seen(Verdict.FIRST, release_id, metric, record)
        if known == digest:
            return Seen(Verdict.REPEAT, release_id, metric)
        self.conflicts[metric] = self.conflicts.get(metric, 0) + 1
        return Seen(Verdict.CONFLICT, release_id, metric)
