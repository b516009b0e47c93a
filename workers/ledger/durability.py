"""Refuse to run the ledger on a Redis that could lose an acknowledged charge (never publish before it is durable).

A durable server has `appendonly yes` and `appendfsync always`: a reply to a charge means it
is on disk. Anything else is refused (`NotDurable`, whose line says how to make the server durable)
unless the caller allows a volatile one, loudly; only a command that has `--allow-volatile` suggests it.
"""

from __future__ import annotations

__all__ = ["NotDurable", "check_durability", "durability_problem", "replica_problem"]

import sys
from collections.abc import Mapping

from dpstream.topology.errors import ConfigError

_DURABLE_CONFIG = "`appendonly yes` and `appendfsync always`"
"""The two redis.conf lines that make a ledger server durable."""


class NotDurable(ConfigError):
    """A ledger Redis that could lose an acknowledged charge; the line says how to make it durable."""

    def __init__(self, url: str, problem: str) -> None:
        super().__init__(
            f"redis {url}: not durable: {problem}: an acknowledged charge could be lost on a crash; "
            f"put {_DURABLE_CONFIG} in its redis.conf and restart it (or CONFIG SET both, then CONFIG REWRITE)"
        )
        self.url = url
        self.problem = problem

    def with_flag_hint(self) -> str:
        """The line for a command that has `--allow-volatile` (budget, exporter, verify, bench): it may suggest it."""
        return f"{self}; or pass --allow-volatile for throwaway runs"


def durability_problem(settings: Mapping[str, str]) -> str | None:
    """None when the server settings are durable, else what is wrong, in one phrase."""
    aof = settings.get("appendonly", "?")
    fsync = settings.get("appendfsync", "?")
    if aof != "yes" or fsync != "always":
        return f"appendonly={aof}, appendfsync={fsync} (need appendonly=yes, appendfsync=always)"
    return None


def check_durability(url: str, settings: Mapping[str, str], allow_volatile: bool) -> None:
    """NotDurable on a non-durable server; with `allow_volatile` print a loud warning instead."""
    problem = durability_problem(settings)
    if problem is None:
        return
    if not allow_volatile:
        raise NotDurable(url, problem)
    print(
        f"dpstream: WARNING: ledger on a NON-DURABLE Redis ({url}: {problem}); "
        "acknowledged charges can be lost on a crash (--allow-volatile)",
        file=sys.stderr,
    )


def replica_problem(min_replicas: int, replicas: int) -> str | None:
    """None when `min_replicas` suits the `replicas` connected, else the risk, in one phrase (a warning)."""
    if min_replicas > replicas:
        return (
            f"min_replicas={min_replicas} but {replicas} replica(s) connected: every release fails closed "
            "until enough replicas connect"
        )
    if 0 < min_replicas < replicas:
        return (
            f"min_replicas={min_replicas} of {replicas} replicas: a failover may promote a replica that lacks "
            "the last acknowledged charges; set min_replicas to the replica count, or replica-priority 0 on "
            "the replicas beyond it"
        )
    return None
