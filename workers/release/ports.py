"""The seams of the release path, as Protocols: what the `Releaser` needs of a ledger and of a
mechanism factory. The ledger backends (`dpstream.workers.ledger.Ledger`), the telemetry timing
proxy and test doubles all satisfy them structurally."""

from __future__ import annotations

__all__ = ["ReleaseLedger", "ReleaseMechanism", "MechanismFactory"]

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from dpstream.topology.model import Accounting, Metric
from dpstream.workers.ledger.allocation import Backlog
from dpstream.workers.ledger.types import ChargeResult, PendingRelease, Quote, ReleaseRequest, StoredCharge


class ReleaseLedger(Protocol):
    """The ledger calls the release protocol makes (see dpstream.workers.release)."""

    @property
    def ledger_id(self) -> str | None:
        """The id of the ledger charges go to, named in every record (None: the in-process ledger)."""
        ...

    async def quote(
        self,
        metric: str,
        window_start: int,
        window_end: int,
        *,
        before: Collection[str] = (),
        backlog: Backlog | None = None,
    ) -> Quote: ...

    async def charged_ends(
        self, scope: str, period_id: str, since: int | None = None
    ) -> tuple[int, dict[str, dict[str, int]]]: ...

    async def charge(self, req: ReleaseRequest) -> ChargeResult: ...

    async def commit(self, scope: str, release_id: str) -> bool: ...

    async def stored_payload(self, scope: str, release_id: str) -> bytes | None: ...

    async def stored_charge(self, scope: str, release_id: str) -> StoredCharge | None: ...

    async def stored_charges(self, scope: str, release_ids: Sequence[str]) -> dict[str, StoredCharge]: ...

    async def running_steps(self, scope: str, metric: str, period_id: str) -> dict[int, bytes]: ...

    async def pending(self, older_than_s: float) -> list[PendingRelease]: ...


class ReleaseMechanism(Protocol):
    """A calibrated mechanism: true values in, a noisy release (with its record fields) out."""

    clamped: int
    """Keys whose true value was clamped to the fixed-point grid's range, over its releases (curator-only)."""

    def release(self, true_values: Mapping[str, Any]) -> Any: ...


class MechanismFactory(Protocol):
    """build_release_mechanism(metric, accounting, cost, delta=...): the mechanism at a charged cost."""

    def __call__(
        self, metric: Metric, accounting: Accounting, cost: float, *, delta: float = 0.0
    ) -> ReleaseMechanism: ...
