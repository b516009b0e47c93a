"""The error families dpstream raises: user mistakes (one clean line, exit 2) versus bugs."""

from __future__ import annotations

__all__ = ["DpstreamError", "ConfigError", "EventError", "InternalError", "ConfigWarning"]

from dataclasses import dataclass


class DpstreamError(Exception):
    """Base of every error dpstream raises on purpose."""


class ConfigError(DpstreamError):
    """A mistake in a topology file or a command line that the user can fix; printed as one line."""


class EventError(DpstreamError):
    """An event that cannot be used (bad JSON, missing field, non-finite value); goes to the dead-letter topic."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class InternalError(DpstreamError):
    """A broken invariant inside dpstream: this is a bug, please report it."""


@dataclass(frozen=True)
class ConfigWarning:
    """Something legal but probably unintended in a topology (validate exits 0 and prints it)."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"warning: {self.where}: {self.message}"
