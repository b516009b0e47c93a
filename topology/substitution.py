"""`${VAR}` / `${VAR:-default}` environment substitution inside topology scalar values.

Shell semantics: the default applies when the variable is unset or empty; `$$` writes a literal `$`.
Anything else that starts with `${` but is not one of these forms is a mistake, reported with its fix.
"""

from __future__ import annotations

__all__ = ["SubstitutionError", "substitute_env", "has_reference"]

import re
from collections.abc import Mapping

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SubstitutionError(ValueError):
    """A `${...}` reference that cannot be expanded; the message names it and the fix."""


def has_reference(text: str) -> bool:
    """True when `text` contains anything substitution would change (`${` or `$$`)."""
    return "${" in text or "$$" in text


def substitute_env(text: str, env: Mapping[str, str]) -> str:
    """Expand every `${VAR}` and `${VAR:-default}` in `text` from `env`.

    >>> substitute_env("${HOST:-localhost}:9092", {})
    'localhost:9092'
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        dollar = text.find("$", i)
        if dollar < 0:
            out.append(text[i:])
            break
        out.append(text[i:dollar])
        nxt = text[dollar + 1 : dollar + 2]
        if nxt == "$":
            out.append("$")
            i = dollar + 2
        elif nxt == "{":
            close = text.find("}", dollar + 2)
            if close < 0:
                raise SubstitutionError(f"unterminated '{text[dollar:]}': close it with '}}', e.g. ${{VAR:-default}}")
            out.append(_expand(text[dollar + 2 : close], env))
            i = close + 1
        else:
            out.append("$")
            i = dollar + 1
    return "".join(out)


def _expand(body: str, env: Mapping[str, str]) -> str:
    name, sep, default = body.partition(":-")
    if not _NAME.fullmatch(name):
        raise SubstitutionError(
            f"'${{{body}}}' is not a valid reference: write ${{NAME}} or ${{NAME:-default}} "
            "with NAME made of letters, digits and '_'"
        )
    value = env.get(name, "")
    if value:
        return value
    if sep:
        return default
    if name in env:
        return ""
    raise SubstitutionError(
        f"environment variable '{name}' is not set: export {name}=... or give a default, ${{{name}:-default}}"
    )
