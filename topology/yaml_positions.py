"""YAML with line numbers: a small located tree built from `yaml.compose`, env-substituted.

The loader needs to say *where* a mistake is, so instead of plain Python values it walks
`Scalar` / `Seq` / `Map` nodes that remember their 1-based line. Duplicate keys (which PyYAML
silently overwrites) are rejected here; `<<` merge keys are honoured.
"""

from __future__ import annotations

__all__ = ["Scalar", "Seq", "Map", "Node", "LocatedError", "compose_located"]

from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from dpstream.topology.substitution import SubstitutionError, has_reference, substitute_env

_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
_MAX_NODES = 100_000
"""A topology has hundreds of values; this bounds alias expansion ("billion laughs")."""


@dataclass(frozen=True)
class Scalar:
    """A leaf value as PyYAML's safe constructor reads it, plus its source text."""

    value: object
    text: str
    line: int
    plain: bool
    """True when written unquoted (so `1e-6` may be read as a number)."""
    substituted: bool = False
    """True when `${...}` was expanded: quoting was for YAML, so numeric text may still be a number."""


@dataclass(frozen=True)
class Seq:
    """A YAML sequence."""

    items: tuple[Node, ...]
    line: int


@dataclass(frozen=True)
class Map:
    """A YAML mapping; `entries` keeps file order as (key, key line, value)."""

    entries: tuple[tuple[str, int, Node], ...]
    line: int

    def get(self, key: str) -> Node | None:
        """The value node of `key`, or None."""
        for name, _, node in self.entries:
            if name == key:
                return node
        return None

    def keys(self) -> list[str]:
        """Keys in file order."""
        return [name for name, _, _ in self.entries]


Node = Scalar | Seq | Map


class LocatedError(Exception):
    """A YAML-level mistake (syntax, duplicate key, bad `${...}`) at a 1-based line."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


def compose_located(text: str, env: Mapping[str, str]) -> Node | None:
    """Parse one YAML document into located nodes; None for an empty document."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        context = exc.context
        if context and exc.context_mark is not None and exc.context_mark.line + 1 != line:
            context = f"{context} (started on line {exc.context_mark.line + 1})"
        parts = [p for p in (context, exc.problem) if p]
        fix = "fix the syntax on this line"
        lines = text.splitlines()
        if "${" in (lines[line - 1] if 0 < line <= len(lines) else "") and "flow" in (exc.context or ""):
            fix = 'inside {...} or [...] quote a ${...} reference, e.g. "${VAR:-default}"'
        raise LocatedError(line, f"invalid YAML: {_one_line('; '.join(parts))}; {fix}") from exc
    except yaml.YAMLError as exc:
        raise LocatedError(1, f"invalid YAML: {_one_line(str(exc))}") from exc
    except RecursionError:
        raise LocatedError(1, "invalid YAML: nested too deeply; a topology needs a few levels only") from None
    if root is None:
        return None
    try:
        return _Builder(env).build(root)
    except RecursionError:
        raise LocatedError(1, "invalid YAML: nested too deeply; a topology needs a few levels only") from None


class _Builder:
    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env
        self._constructor = yaml.constructor.SafeConstructor()
        self._resolver = yaml.resolver.Resolver()
        self._open: set[int] = set()
        self._built = 0

    def build(self, node: yaml.Node) -> Node:
        line = node.start_mark.line + 1
        self._built += 1
        if self._built > _MAX_NODES:
            raise LocatedError(
                line, f"more than {_MAX_NODES} values (aliases expand too far); write the topology out plainly"
            )
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, line)
        if id(node) in self._open:
            raise LocatedError(line, "an alias refers to the mapping or list that contains it; remove the cycle")
        self._open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return Seq(tuple(self.build(item) for item in node.value), line)
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, line)
        finally:
            self._open.discard(id(node))
        raise LocatedError(line, f"unsupported YAML node {type(node).__name__}")

    def _scalar(self, node: yaml.ScalarNode, line: int) -> Scalar:
        plain = node.style is None
        text = node.value
        substituted = False
        if (node.tag == _STR_TAG or plain) and has_reference(text):
            try:
                text = substitute_env(text, self._env)
            except SubstitutionError as exc:
                raise LocatedError(line, str(exc)) from exc
            tag = self._resolver.resolve(yaml.ScalarNode, text, (True, False)) if plain else _STR_TAG  # type: ignore[no-untyped-call]  # types-PyYAML: Resolver.resolve is unannotated
            node = yaml.ScalarNode(tag, text, node.start_mark, node.end_mark, node.style)
            substituted = True
        try:
            value = self._constructor.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError) as exc:  # ValueError: an impossible unquoted date (2026-02-30)
            raise LocatedError(line, f"cannot read {text!r}: {_one_line(str(exc))}") from exc
        return Scalar(value, _one_line(text), line, plain, substituted)

    def _mapping(self, node: yaml.MappingNode, line: int) -> Map:
        entries: list[tuple[str, int, Node]] = []
        seen: dict[str, int] = {}
        merged: list[tuple[str, int, Node]] = []
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE_TAG:
                merged.extend(self._merge_entries(value_node))
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise LocatedError(key_line, "a key must be a plain name, not a list or mapping")
            key = key_node.value
            if key in seen:
                raise LocatedError(
                    key_line, f"duplicate key '{key}' (first written on line {seen[key]}); keep only one"
                )
            seen[key] = key_line
            entries.append((key, key_line, self.build(value_node)))
        for entry in merged:
            if entry[0] not in seen:
                seen[entry[0]] = entry[1]
                entries.append(entry)
        return Map(tuple(entries), line)

    def _merge_entries(self, value_node: yaml.Node) -> list[tuple[str, int, Node]]:
        sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        out: list[tuple[str, int, Node]] = []
        for source in sources:
            built = self.build(source)
            if not isinstance(built, Map):
                raise LocatedError(built.line, "'<<' merges a mapping (or a list of mappings) only")
            out.extend(e for e in built.entries if e[0] not in {k for k, _, _ in out})
        return out


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
