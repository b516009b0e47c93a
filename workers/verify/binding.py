"""The worker's start check that its releases topic is fed by its ledger only.

Each ledger namespace has an id (`ledger.identity`) and every release record names it. A worker
whose ledger is not the one that charged the releases of its topology version already on the
releases topic (a missing or mistyped namespace: a fresh, full budget) would publish a second
noisy value for a known release_id. So before Faust starts, a publishing worker reads the releases
topic (no consumer group, nothing committed) and refuses, in one line, when a record of its
topology version names another ledger id (or null: charged to no ledger). A topic that does not
exist yet, or a broker that cannot be reached, passes here: the worker's own start reports it.

The check reads only what can still matter: records stamped (P(w), at or after the window's end)
within the ledger's idempotency horizon, plus a margin. An older record's window is past the horizon
on this ledger too, so it is refused (`expired`), never noised again, whichever ledger charged it.
The same check runs again when the release side first reaches its ledger (`ReleaseSide.start`), so a
worker that started while Redis was down never publishes unchecked.

Two fresh ledgers starting at once can both find the topic empty; consumers therefore keep the
first record per release_id and alarm on a later one that differs (`dpstream verify` names them).
"""

from __future__ import annotations

__all__ = ["check_releases_ledger", "check_publishing_ledger", "read_since_ms"]

from typing import TYPE_CHECKING

from dpstream.topology.errors import ConfigError
from dpstream.workers.ledger.base import HORIZON_MARGIN_S
from dpstream.workers.runtime.admin import TopicAdminError, start_admin
from dpstream.workers.runtime.kafka_security import KafkaSecurity
from dpstream.workers.verify.checks import foreign_ledger_records
from dpstream.workers.verify.sources import read_topic

if TYPE_CHECKING:
    from dpstream.topology.model import Topology
    from dpstream.workers.ledger.base import Ledger


def read_since_ms(horizon_s: int | None, now_s: float) -> int | None:
    """Kafka timestamp (ms) before which no release record can matter at `now_s`: its window ended at
    or before its stamp P(w), so past `horizon_s` (the ledger's idempotency horizon) it is expired
    here; a further `HORIZON_MARGIN_S` covers this clock stepping back. None (read everything) when
    the ledger never drops records.

    >>> read_since_ms(86_400, 200_000.0)
    110000000
    """
    if horizon_s is None:
        return None
    return max(0, int(now_s - horizon_s - HORIZON_MARGIN_S) * 1000)


async def check_publishing_ledger(
    bootstrap: str,
    topology: Topology,
    ledger: Ledger,
    ledger_where: str,
    now_s: float,
    security: KafkaSecurity | None = None,
) -> None:
    """The check every publishing process runs against an opened `ledger` (`check_releases_ledger` on
    the topology's releases topic, read from `read_since_ms`); ConfigError (one line) when it fails."""
    await check_releases_ledger(
        bootstrap,
        topology.sinks.releases,
        topology.topology_version,
        ledger.ledger_id,
        ledger_where,
        security,
        since_ms=read_since_ms(ledger.idempotency_horizon_s, now_s),
    )


async def check_releases_ledger(
    bootstrap: str,
    topic: str,
    topology_version: str,
    ledger_id: str | None,
    ledger_where: str,
    security: KafkaSecurity | None = None,
    since_ms: int | None = None,
) -> None:
    """ConfigError (one line) when `topic` holds a record of `topology_version` from a ledger other
    than `ledger_id`; `ledger_where` names this worker's ledger (a redacted URL) in the message. With
    `since_ms`, records stamped before it are not read (`read_topic`)."""
    try:
        admin = await start_admin(bootstrap, 10_000, security)
    except (TopicAdminError, ConfigError):
        return  # unreachable, or credentials the worker's own start reports in its own line
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if not any(t["error_code"] == 0 and t["partitions"] for t in described):
        return  # no releases topic yet: nothing published, nothing to bind
    foreign = foreign_ledger_records(
        await read_topic(bootstrap, topic, security=security, since_ms=since_ms), topology_version, ledger_id
    )
    if not foreign:
        return
    first, named = foreign[0]
    theirs = f"ledger id {named}" if named is not None else 'no ledger ("ledger": null, an in-process ledger)'
    raise ConfigError(
        f"releases topic {topic!r} holds {len(foreign)} record(s) of topology version {topology_version} "
        f"charged to {theirs} (first at {first.where}), not to this worker's ledger {ledger_where} "
        f"(id {ledger_id}): it would publish second noisy values for known release_ids; point --redis "
        "(and its namespace) at the ledger that charged them, or give this deployment its own releases topic"
    )
