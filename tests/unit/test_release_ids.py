"""release_id: deterministic sha256 of (topology_version, metric, window)."""

from __future__ import annotations

import hashlib

from dpstream.workers.release import release_id


def test_release_id_is_deterministic_sha256_hex():
    """The same inputs give the same 64-hex id, equal to sha256 of the '|'-joined fields."""
    rid = release_id("abc", "page_views", 60, 120)
    assert rid == release_id("abc", "page_views", 60, 120)
    assert rid == hashlib.sha256(b"abc|page_views|60|120").hexdigest()
    assert len(rid) == 64 and int(rid, 16) >= 0


def test_release_id_changes_with_every_field():
    """Changing the topology version, metric, start or end names a different release."""
    base = release_id("v1", "m", 0, 60)
    others = {
        release_id("v2", "m", 0, 60),
        release_id("v1", "n", 0, 60),
        release_id("v1", "m", 60, 120),
        release_id("v1", "m", 0, 120),
    }
    assert base not in others and len(others) == 4
