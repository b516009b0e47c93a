"""Typed readers for located YAML values: each returns a checked value or raises `FieldProblem`.

Every message has the same shape, `<subject>: <field> <value as written>: <problem and fix>`,
so the loader only has to prefix `FILE:LINE:`.
"""

from __future__ import annotations

__all__ = [
    "FieldProblem",
    "show",
    "suggest",
    "read_str",
    "read_number",
    "read_int",
    "read_bool",
    "read_duration",
    "read_enum",
    "read_map",
    "is_null",
]

import difflib
import math
import re
from enum import Enum
from typing import TypeVar

from dpstream.topology.durations import parse_duration
from dpstream.topology.yaml_positions import Map, Node, Scalar, Seq

E = TypeVar("E", bound=Enum)

_NUMBER_TEXT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
_INT_TEXT = re.compile(r"^[-+]?\d+$")
_ZERO_DURATION = re.compile(r"^\s*0+\s*[smhd]?\s*$")
_MAX_SHOWN = 60


class FieldProblem(Exception):
    """One bad field, with the 1-based line it was written on and the complete message."""

    def __init__(self, line: int, text: str) -> None:
        super().__init__(text)
        self.line = line
        self.text = text


def show(node: Node) -> str:
    """The value as the user wrote it, shortened: `'median'`, `1.0e-6`, `[200, 0]`, `{tumbling: 7m}`."""
    text = _show(node)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _show(node: Node, nested: bool = False) -> str:
    if isinstance(node, Scalar):
        if node.value is None:
            return "~" if nested else "(empty)"
        return f"'{node.text}'" if isinstance(node.value, str) and not nested else node.text
    if isinstance(node, Seq):
        return "[" + ", ".join(_show(item, True) for item in node.items) + "]"
    return "{" + ", ".join(f"{key}: {_show(value, True)}" for key, _, value in node.entries) + "}"


def suggest(name: str, known: list[str] | tuple[str, ...]) -> str:
    """`did you mean 'x'?` when a close match exists, else the list of valid names."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if close:
        return f"did you mean '{close[0]}'?"
    return "valid: " + ", ".join(known) if known else "none are declared"


def is_null(node: Node | None) -> bool:
    """True for an absent field or an empty / `~` / `null` value (treated as not given)."""
    return node is None or (isinstance(node, Scalar) and node.value is None)


def read_str(node: Node, subject: str, field: str) -> str:
    """A non-empty string (numbers and booleans must be quoted to become names)."""
    if isinstance(node, Scalar) and isinstance(node.value, str):
        if not node.value.strip():
            raise FieldProblem(node.line, f"{subject}: {field} is empty: give a name")
        return node.value
    raise FieldProblem(
        node.line, f'{subject}: {field} {show(node)}: must be a string; quote it, e.g. {field}: "{_plain(node)}"'
    )


_NUMBER_EXAMPLES = {"reserve": "0.2", "warn_at": "0.8", "delta": "1.0e-6", "weight": "1", "stretch": "1.5"}
"""A valid example for the numeric fields whose valid range excludes 1.0 or reads better with another value."""


def read_number(node: Node, subject: str, field: str) -> float:
    """A finite real number; booleans are not numbers, unquoted `1e-6` is."""
    if isinstance(node, Scalar):
        value = node.value
        if isinstance(value, str) and (node.plain or node.substituted) and _NUMBER_TEXT.match(value.strip()):
            value = float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer beyond the float range
                number = math.inf
            if not math.isfinite(number):
                raise FieldProblem(node.line, f"{subject}: {field} {show(node)}: must be a finite number")
            return number
    text = node.value.strip() if isinstance(node, Scalar) and isinstance(node.value, str) else ""
    if text.endswith("%") and _NUMBER_TEXT.match(text[:-1].strip()):
        fraction = float(text[:-1]) / 100
        raise FieldProblem(
            node.line,
            f"{subject}: {field} {show(node)}: must be a number; write the fraction, e.g. {field}: {fraction:g}",
        )
    example = _NUMBER_EXAMPLES.get(field, "1.0")
    raise FieldProblem(node.line, f"{subject}: {field} {show(node)}: must be a number, e.g. {field}: {example}")


MAX_WHOLE = 2**53
"""The largest whole number a field takes: every integer up to it is exact as a float."""


def read_int(node: Node, subject: str, field: str, minimum: int) -> int:
    """A whole number >= `minimum`; `2.0`, `true` and `"2"` are refused."""
    value = node.value if isinstance(node, Scalar) else None
    if isinstance(node, Scalar) and node.substituted and isinstance(value, str) and _INT_TEXT.match(value.strip()):
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < minimum:
            raise FieldProblem(node.line, f"{subject}: {field} {show(node)}: must be at least {minimum}")
        if value > MAX_WHOLE:  # sensitivities and costs are computed in floats: keep them exact
            raise FieldProblem(node.line, f"{subject}: {field} {show(node)}: must be at most {MAX_WHOLE:,}")
        return value
    raise FieldProblem(
        node.line,
        f"{subject}: {field} {show(node)}: must be a whole number >= {minimum}, e.g. {field}: {max(minimum, 1)}",
    )


def read_bool(node: Node, subject: str, field: str) -> bool:
    """`true` or `false`."""
    if isinstance(node, Scalar) and isinstance(node.value, bool):
        return node.value
    raise FieldProblem(node.line, f"{subject}: {field} {show(node)}: must be true or false")


def read_duration(node: Node, subject: str, field: str, allow_zero: bool = False) -> int:
    """Whole seconds from `30s`, `5m`, `1h`, `1d` or an integer number of seconds."""
    if isinstance(node, Scalar) and not isinstance(node.value, bool) and isinstance(node.value, (int, str)):
        if allow_zero and _ZERO_DURATION.match(str(node.value)):
            return 0
        try:
            return parse_duration(node.value)
        except ValueError:
            pass
    zero = " or 0" if allow_zero else ""
    raise FieldProblem(node.line, f"{subject}: {field} {show(node)}: not a duration; write e.g. 30s, 5m, 1h, 1d{zero}")


def read_enum(node: Node, subject: str, field: str, enum: type[E]) -> E:
    """One of the Enum's values, parsed once here."""
    valid = [member.value for member in enum]
    if isinstance(node, Scalar) and isinstance(node.value, str):
        for member in enum:
            if member.value == node.value:
                return member
        hint = suggest(node.value, valid)
        if not hint.startswith("valid"):
            hint += " (valid: " + ", ".join(valid) + ")"
        raise FieldProblem(node.line, f"{subject}: {field} {show(node)}: unknown {field}; {hint}")
    raise FieldProblem(node.line, f"{subject}: {field} {show(node)}: must be one of " + ", ".join(valid))


def read_map(node: Node, subject: str, field: str, known: tuple[str, ...], example: str) -> Map:
    """A mapping whose keys are all in `known` (unknown keys get a did-you-mean)."""
    if not isinstance(node, Map):
        raise FieldProblem(node.line, f"{subject}: {field} {show(node)}: must be a mapping, e.g. {field}: {example}")
    for key, line, _ in node.entries:
        if key not in known:
            raise FieldProblem(line, f"{subject}: {field}: unknown field '{key}'; {suggest(key, known)}")
    return node


def _plain(node: Node) -> str:
    return node.text if isinstance(node, Scalar) and node.value is not None else "name"
