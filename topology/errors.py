"""The error families dpstream raises: user mistakes (one clean line, exit 2) versus bugs."""

from __future__ import annotations

__all__ = ["DpstreamError", "ConfigError", "EventError", "InternalError", "ConfigWarning", "one_line"]

from dataclasses import dataclass

_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}
"""Every character `str.splitlines` breaks at, and its escape as Python writes it (`\\n`, `\\u2028`)."""


def one_line(text: str) -> str:
    """`text` with its line breaks escaped: a name or value the user wrote can never split a message."""
    return text.translate(_LINE_BREAKS)


class DpstreamError(Exception):
    """Base of every error dpstream raises on purpose."""


class ConfigError(DpstreamError):
    """A mistake in a topology file or a command line that the user can fix; printed as one line."""

    def __str__(self) -> str:
        return one_line(super().__str__())


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
