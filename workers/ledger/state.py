"""A scope's stored state as Python dicts, and the one applier of a decided step's writes.

A decided step (`decision.decide`, then `writes`) is a tuple of `Op`s on a scope's logical keys.
The in-process ledger holds its scopes as `ScopeState`s and applies the ops to them under its
lock; the Redis ledger sends the same ops to `lua/apply.lua` and applies them to its cached view
(`view_only`: the keys a decision reads) so its next decision needs no read.
"""

from __future__ import annotations

__all__ = ["Key", "Op", "ScopeState", "apply_ops", "zcount_from"]

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, ...]
"""A scope's key by role: ("config",), ("breaker",), ("period", pid), ("periods",), ("release", rid),
("ends", pid, metric), ("running", pid, top field), ("pending",), ("parked",), ("audit",):
`keys.ScopeKeys` names each in Redis."""

Op = tuple[str, Key, tuple[Any, ...]]
"""One write: (command, key, arguments): HSET (field, value, ...), HINCRBY (field, by, ...), HDEL
(fields), ZADD (score, member), ZADDNX (score, member: the member must be new), XADD (field,
value, ...), EXPIRE (seconds)."""

_VIEW_KEYS = frozenset(("config", "breaker", "period", "periods"))
"""The keys a decision reads: a cached view keeps only these."""


@dataclass
class ScopeState:
    """Everything one scope's Redis keys hold, as Python values (`payload` as bytes)."""

    config: dict[str, str] = field(default_factory=dict)
    breaker: dict[str, str] = field(default_factory=dict)
    periods: dict[str, dict[str, str]] = field(default_factory=dict)
    period_index: dict[str, int] = field(default_factory=dict)
    releases: dict[str, dict[str, Any]] = field(default_factory=dict)
    ends: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    ends_sorted: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    """The scores of each `ends` zset in order, so ZCOUNT end +inf is a bisection, not a scan."""
    audit: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    pending: dict[str, int] = field(default_factory=dict)
    parked: dict[str, str] = field(default_factory=dict)
    """Release id → the JSON of its parked window."""
    running: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(period id, the metric's top field) → window start → a running total's stored step state."""

    def hash(self, key: Key) -> dict[str, Any]:
        """The hash a key names (created empty on first write, as Redis does)."""
        role = key[0]
        if role == "config":
            return self.config
        if role == "breaker":
            return self.breaker
        if role == "period":
            return self.periods.setdefault(key[1], {})
        if role == "release":
            return self.releases.setdefault(key[1], {})
        if role == "parked":
            return self.parked
        if role == "running":
            return self.running.setdefault((key[1], key[2]), {})
        raise KeyError(key)


def _zadd(s: ScopeState, key: tuple[str, str], member: str, score: int) -> None:
    """ZADD on an `ends` zset: a member's score is replaced, never counted twice."""
    members = s.ends.setdefault(key, {})
    scores = s.ends_sorted.setdefault(key, [])
    old = members.get(member)
    if old is not None:
        del scores[bisect_left(scores, old)]
    members[member] = score
    if not scores or scores[-1] <= score:
        scores.append(score)  # windows mostly close in order
    else:
        insort(scores, score)


def zcount_from(s: ScopeState, key: tuple[str, str], low: int) -> int:
    """ZCOUNT key low +inf on an `ends` zset."""
    scores = s.ends_sorted.get(key)
    if not scores or scores[-1] < low:
        return 0
    return len(scores) - bisect_left(scores, low)


def apply_ops(s: ScopeState, ops: Iterable[Op], audit_id: Callable[[], str], *, view_only: bool = False) -> None:
    """Make the writes `ops` on `s`, in order (`audit_id` names each audit entry); `view_only` keeps
    only what a decision reads (a cached view: no releases, ends, pending or audit)."""
    for command, key, args in ops:
        role = key[0]
        if view_only and role not in _VIEW_KEYS:
            continue
        # the commands a grant makes most come first; field/value pairs are read off one iterator
        if command == "HINCRBY":
            h = s.hash(key)
            pairs = iter(args)
            for name, by in zip(pairs, pairs, strict=True):
                h[name] = str(int(h.get(name, 0)) + int(by))
        elif command == "HSET":
            pairs = iter(args)
            s.hash(key).update(zip(pairs, pairs, strict=True))
        elif command == "XADD":
            pairs = iter(args)
            s.audit.append((audit_id(), dict(zip(pairs, pairs, strict=True))))
        elif command == "EXPIRE":
            continue  # (nothing expires in process)
        elif command == "ZADD" or command == "ZADDNX":
            score, member = int(args[0]), str(args[1])
            if role == "periods":
                if command == "ZADD" or member not in s.period_index:
                    s.period_index[member] = score
            elif role == "pending":
                s.pending[member] = score
            else:
                _zadd(s, (key[1], key[2]), member, score)
        elif command == "HDEL":
            h = s.hash(key)
            for name in args:
                h.pop(name, None)
        else:
            raise KeyError(command)
