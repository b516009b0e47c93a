"""Every Redis key of the ledger, built here only: `dpstream:{scope}:…`, hash-tagged per scope.

The braces make all keys of one scope hash to one Redis Cluster slot, so each script touches a
single slot. Example: `dpstream:{web-daily}:period:2026-11-30`. A namespace (`namespace=` in the
ledger URL) puts a deployment's keys under `dpstream:<namespace>:…`, so two deployments can
share one Redis, even with the same scope names: `dpstream:prod:{web-daily}:period:2026-11-30`.
"""

from __future__ import annotations

__all__ = [
    "LEDGER_ID_KEY",
    "PREFIX",
    "SCOPES_INDEX",
    "ScopeKeys",
    "check_namespace",
    "check_scope_name",
    "version_schedule_start_key",
    "in_namespace",
]

import re
from dataclasses import dataclass

from dpstream.topology.errors import ConfigError

PREFIX = "dpstream"
SCOPES_INDEX = f"{PREFIX}:scopes"
"""Set of registered scope names (outside any hash tag; read by the CLI, never by a script)."""
LEDGER_ID_KEY = f"{PREFIX}:{{ledger}}:id"
"""String: the ledger namespace's id (`ledger.identity`), written once by SET NX; its own hash tag."""
_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_namespace(namespace: str, where: str = "ledger namespace") -> str:
    """A key namespace: 1-64 letters, digits, `_`, `.` or `-` (no braces or colons, so hash tags hold)."""
    if not _NAMESPACE.fullmatch(namespace):
        raise ConfigError(
            f"{where} {namespace!r}: use 1-64 letters, digits, '_', '.' or '-' (no braces, colons or spaces)"
        )
    return namespace


def in_namespace(key: str, namespace: str) -> str:
    """The key `key` (built for the default namespace, `dpstream:…`) in `namespace` (`dpstream:<ns>:…`)."""
    if not namespace:
        return key
    if not key.startswith(PREFIX + ":"):
        raise ConfigError(f"ledger key {key!r} is not a dpstream key (this is a bug)")
    return f"{PREFIX}:{check_namespace(namespace)}:{key[len(PREFIX) + 1 :]}"


def version_schedule_start_key(topology_version: str) -> str:
    """String: the recorded start (epoch s) of a topology version's deployment, `dpstream:{deploy}:start:<version>`.

    Its own hash tag: it belongs to no scope, and only a SET NX ever writes it.
    """
    if not topology_version or any(ch.isspace() for ch in topology_version):
        raise ConfigError(f"topology version {topology_version!r}: must be non-empty, without spaces")
    return f"{PREFIX}:{{deploy}}:start:{topology_version}"


def check_scope_name(scope: str) -> str:
    """A scope name usable inside a hash tag: non-empty, no braces, no whitespace."""
    if not scope or any(ch in scope for ch in "{}:") or any(ch.isspace() for ch in scope):
        raise ConfigError(
            f"budget scope {scope!r}: the ledger needs a name without braces, colons or spaces: rename it"
        )
    return scope


@dataclass(frozen=True)
class ScopeKeys:
    """The keys of one budget scope."""

    scope: str
    namespace: str = ""

    def __post_init__(self) -> None:
        check_scope_name(self.scope)
        if self.namespace:
            check_namespace(self.namespace)

    @property
    def base(self) -> str:
        """`dpstream:{scope}` (or `dpstream:<namespace>:{scope}`): the hash-tagged prefix."""
        if self.namespace:
            return f"{PREFIX}:{self.namespace}:{{{self.scope}}}"
        return f"{PREFIX}:{{{self.scope}}}"

    @property
    def fence(self) -> str:
        """Counter: written (INCR) right before a `WAIT`, so the WAIT covers every earlier write
        of the scope, whichever connection made it (see `redis_backend.RedisLedger._replicated`)."""
        return f"{self.base}:fence"

    @property
    def turn(self) -> str:
        """String: the process whose charges go first for a moment, after others' writes kept them
        stale (set NX with an expiry; see `lua/apply.lua`)."""
        return f"{self.base}:turn"

    @property
    def config(self) -> str:
        """Hash: cap, reserve, warn threshold (units), accounting, digest of the registered config,
        and `schedule_start`: the first schedule start S recorded with the scope (`steps.decide_schedule`)."""
        return f"{self.base}:config"

    @property
    def breaker(self) -> str:
        """Hash: manual breaker (reason, actor) and the automatic open of one period."""
        return f"{self.base}:breaker"

    @property
    def audit(self) -> str:
        """Stream: every charge, refusal, breaker change, grant and config change."""
        return f"{self.base}:audit"

    @property
    def pending(self) -> str:
        """Sorted set: release ids charged but not yet published, scored by charge time (ms)."""
        return f"{self.base}:pending"

    @property
    def parked(self) -> str:
        """Hash: release id → JSON of a window parked after repeated internal release failures
        (metric, window, attempts, error class, state parked|retry); see `steps.decide_park`."""
        return f"{self.base}:parked"

    @property
    def periods(self) -> str:
        """Sorted set: period ids seen, scored by period start (s)."""
        return f"{self.base}:periods"

    def period(self, period_id: str) -> str:
        """Hash of one period block: its terms fixed at open (cap, reserve, warn, accounting,
        delta_cap, start) and its counters (spent, delta_spent, granted, refused, grant)."""
        return f"{self.base}:period:{period_id}"

    def ends(self, period_id: str, metric: str) -> str:
        """Sorted set: a metric's charged releases in one period, scored by window end (s)."""
        return f"{self.base}:period:{period_id}:ends:{metric}"

    def running(self, period_id: str, top_field: str) -> str:
        """Hash: a running total's stored step states in one period (window start → state bytes), under
        its metric's largest-charges field (`ledger.topm.field`: per metric and topology version)."""
        return f"{self.base}:period:{period_id}:running:{top_field}"

    def release(self, release_id: str) -> str:
        """Hash of one release: state, cost, final payload bytes, timestamps."""
        return f"{self.base}:release:{release_id}"
