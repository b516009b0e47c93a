"""The ledger's own error: Redis cannot be reached, so nothing is charged (fail closed)."""

from __future__ import annotations

__all__ = ["LedgerUnavailable"]

from dpstream.topology.errors import DpstreamError


class LedgerUnavailable(DpstreamError):
    """The ledger's store did not answer: no charge was made, nothing may be published."""
