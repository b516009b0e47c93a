"""Every Redis key of the ledger, built here only: `dpstream:{scope}:…`, hash-tagged per scope.

The braces make all keys of one scope hash to one Redis Cluster slot, so each script touches a
single slot. Example: `dpstream:{web-daily}:period:2026-11-30`.
"""

from __future__ import annotations

__all__ = ["PREFIX", "SCOPES_INDEX", "ScopeKeys", "check_scope_name", "deployment_start_key"]

from dataclasses import dataclass

from dpstream.topology.errors import ConfigError

PREFIX = "dpstream"
SCOPES_INDEX = f"{PREFIX}:scopes"
"""Set of registered scope names (outside any hash tag; read by the CLI, never by a script)."""


def deployment_start_key(topology_version: str) -> str:
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

    def __post_init__(self) -> None:
        check_scope_name(self.scope)

    @property
    def base(self) -> str:
        """`dpstream:{scope}`: the hash-tagged prefix."""
        return f"{PREFIX}:{{{self.scope}}}"

    @property
    def config(self) -> str:
        """Hash: cap, reserve, warn threshold (units), accounting, digest of the registered config."""
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
        """Sorted set: release ids reserved but not yet published, scored by reserve time (ms)."""
        return f"{self.base}:pending"

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

    def release(self, release_id: str) -> str:
        """Hash of one release: state, cost, final payload bytes, timestamps."""
        return f"{self.base}:release:{release_id}"
