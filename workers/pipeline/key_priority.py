"""L0's key priority: which of a unit's keys in one window count first, as a fixed public hash on arrays.

A unit with more than `max_keys` keys in a window keeps those of smallest priority (ties, about 2^-64 a
pair, fall to the key string). The priority is a function of (metric, unit, window start, key) alone:
the same on every worker, after every restart and for every replay, whatever order the rows came in. It
need not be secret: a unit that steers which of its own keys count stays inside its own bound.

Each string is hashed once (the first 8 bytes of its BLAKE2b `unit_key`, which `Codes.digests` caches
per held unit and key), and the four parts are mixed on uint64 arrays with SplitMix64's finaliser, so a
close ranks every over-bound unit's keys at once. `bench pipeline_core` on web-analytics (L0 ranks the
keys of the heavy units of page_views and top_referrers): hashing each (unit, window, key) in Python cost
about 0.7 µs an event.
"""

from __future__ import annotations

__all__ = ["key_priority", "key_priorities", "string_hashes"]

import numpy as np

from dpstream.workers.pipeline.window_caps import UNIT_KEY_BYTES, unit_key

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S1, _S2, _S3 = np.uint64(30), np.uint64(27), np.uint64(31)
_WORD = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijection of uint64 with full avalanche), element-wise."""
    x = (x ^ (x >> _S1)) * _M1
    x = (x ^ (x >> _S2)) * _M2
    return x ^ (x >> _S3)


def string_hashes(digests: np.ndarray) -> np.ndarray:
    """The 64-bit hash of each string from its `unit_key` digest (an object array of 16-byte bytes)."""
    raw = np.frombuffer(b"".join(digests.tolist()), dtype=">u8")
    return raw[:: UNIT_KEY_BYTES // 8].astype(np.uint64)


def key_priorities(metric: str, units: np.ndarray, starts: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The priority (uint64) of each (unit, window start, key) of `metric`: `units` and `keys` are
    `string_hashes`, `starts` window starts (int64, or Python ints past int64, taken modulo 2^64)."""
    if starts.dtype == object:
        window = np.array([s & _WORD for s in starts.tolist()], np.uint64)
    else:
        window = starts.astype(np.int64).view(np.uint64)
    (own,) = string_hashes(np.array([unit_key(metric)], object))
    return _mix(_mix(_mix(units ^ own) ^ window) ^ keys)


def key_priority(metric: str, unit: str, window_start: int, key: str) -> int:
    """The priority of one key of `unit` in the window of `metric` starting at `window_start`."""
    unit_hash, key_hash = string_hashes(np.array([unit_key(unit), unit_key(key)], object))
    start = np.array([window_start], object if not -(1 << 63) <= window_start < 1 << 63 else np.int64)
    return int(key_priorities(metric, np.array([unit_hash]), start, np.array([key_hash]))[0])
