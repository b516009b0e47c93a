"""The one error the local stack adds: a service that did not come up (with the tail of its log)."""

from __future__ import annotations

__all__ = ["ServiceStartError"]

from dpstream.topology.errors import DpstreamError


class ServiceStartError(DpstreamError):
    """A local service exited or did not answer in time; the message carries the tail of its log."""
