"""Tests of topology.schema: the JSON Schema covers every field the loader accepts and accepts the examples."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from _topology_strategies import valid_topologies
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpstream.topology.dumper import topology_document
from dpstream.topology.loader import ACCEPTED_FIELDS, REQUIRED_FIELDS, START_MAX_S, START_MIN_S, load_topology_text
from dpstream.topology.model import Accounting, Aggregate, Mechanism, Topology
from dpstream.topology.schema import topology_schema

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "topology" / "examples").glob("*.yaml"))
SCHEMA = topology_schema()

_ANNOTATIONS = {"$schema", "$id", "title", "description", "default"}
_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_VALUE_KEYWORDS = ("type", "enum", "const", "minLength", "pattern", *_BOUNDS)
_OBJECT_KEYWORDS = ("properties", "patternProperties", "additionalProperties", "required", "minProperties")
_ARRAY_KEYWORDS = ("items", "minItems", "maxItems", "uniqueItems")
_APPLICATORS = ("$ref", "anyOf", "oneOf", "allOf", "not", "if")


def _errors(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """A tiny draft 2020-12 validator for exactly the keywords topology_schema uses (unknown ones fail)."""
    out: list[str] = []
    for key, arg in schema.items():
        if key in _ANNOTATIONS or key in ("then", "$defs"):
            continue
        if key in _APPLICATORS:
            out += _applicator_errors(value, schema, key, arg, where)
        elif key in _VALUE_KEYWORDS:
            out += _value_errors(value, key, arg, where)
        elif key in _OBJECT_KEYWORDS:
            if isinstance(value, dict):
                out += _object_errors(value, schema, key, where)
        elif key in _ARRAY_KEYWORDS:
            if isinstance(value, list):
                out += _array_errors(value, key, arg, where)
        else:
            raise AssertionError(f"validator does not know keyword {key!r}")
    return out


def _applicator_errors(value: Any, schema: dict[str, Any], key: str, arg: Any, where: str) -> list[str]:
    """$ref, anyOf, oneOf, allOf, not and if (with its then): the keywords that apply subschemas."""
    out: list[str] = []
    if key == "$ref":
        assert arg.startswith("#/$defs/"), arg
        out += _errors(value, SCHEMA["$defs"][arg.removeprefix("#/$defs/")], where)
    elif key == "anyOf":
        if not any(not _errors(value, sub, where) for sub in arg):
            out.append(f"{where}: matches none of anyOf")
    elif key == "oneOf":
        if sum(not _errors(value, sub, where) for sub in arg) != 1:
            out.append(f"{where}: does not match exactly one of oneOf")
    elif key == "allOf":
        for sub in arg:
            out += _errors(value, sub, where)
    elif key == "not":
        if not _errors(value, arg, where):
            out.append(f"{where}: matches a 'not' schema")
    elif key == "if" and not _errors(value, arg, where) and "then" in schema:
        out += _errors(value, schema["then"], where)
    return out


def _value_errors(value: Any, key: str, arg: Any, where: str) -> list[str]:
    """type, enum, const, minLength, pattern and the numeric bounds: checks of the value itself."""
    out: list[str] = []
    if key == "type":
        if not _TYPES[arg](value):
            out.append(f"{where}: not {arg}")
    elif key == "enum":
        if value not in arg:
            out.append(f"{where}: {value!r} not in {arg}")
    elif key == "const":
        if value != arg or isinstance(value, bool) != isinstance(arg, bool):
            out.append(f"{where}: {value!r} != {arg!r}")
    elif key in _BOUNDS:
        out += _bound_errors(value, key, arg, where)
    elif key == "minLength":
        if isinstance(value, str) and len(value) < arg:
            out.append(f"{where}: shorter than {arg}")
    elif key == "pattern" and isinstance(value, str) and not re.search(arg, value):
        out.append(f"{where}: {value!r} does not match {arg}")
    return out


def _bound_errors(value: Any, key: str, arg: Any, where: str) -> list[str]:
    """minimum, maximum, exclusiveMinimum, exclusiveMaximum: numbers only (and finite)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number:
        return []
    ok = {
        "minimum": value >= arg,
        "maximum": value <= arg,
        "exclusiveMinimum": value > arg,
        "exclusiveMaximum": value < arg,
    }[key]
    if not ok or not math.isfinite(value):
        return [f"{where}: {value!r} fails {key} {arg}"]
    return []


def _array_errors(value: list[Any], key: str, arg: Any, where: str) -> list[str]:
    """items, minItems, maxItems, uniqueItems."""
    out: list[str] = []
    if key == "items":
        for i, item in enumerate(value):
            out += _errors(item, arg, f"{where}[{i}]")
    elif key == "minItems" and len(value) < arg or key == "maxItems" and len(value) > arg:
        out.append(f"{where}: {len(value)} items fails {key} {arg}")
    elif key == "uniqueItems" and arg and len(set(map(repr, value))) != len(value):
        out.append(f"{where}: items not unique")
    return out


def _object_errors(value: dict[str, Any], schema: dict[str, Any], key: str, where: str) -> list[str]:
    props = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    out: list[str] = []
    if key == "properties":
        for name, sub in props.items():
            if name in value:
                out += _errors(value[name], sub, f"{where}.{name}")
    elif key == "patternProperties":
        for name, item in value.items():
            for pattern, sub in patterns.items():
                if re.search(pattern, name):
                    out += _errors(item, sub, f"{where}.{name}")
    elif key == "additionalProperties":
        for name in value:
            matched = name in props or any(re.search(p, name) for p in patterns)
            if not matched and schema["additionalProperties"] is False:
                out.append(f"{where}: unexpected {name!r}")
    elif key == "required":
        out += [f"{where}: missing {name!r}" for name in schema["required"] if name not in value]
    elif key == "minProperties" and len(value) < schema["minProperties"]:
        out.append(f"{where}: fewer than {schema['minProperties']} properties")
    return out


_SECTION_DEFS = {
    "topology": None,
    "source": "source",
    "budget": "budget",
    "metric": "metric",
    "contribution": "contribution",
    "postprocess": "postprocess",
    "sinks": "sinks",
    "kafka": "kafka",
    "redis": "redis",
}


def _properties(section: str) -> set[str]:
    if section == "window":
        return {k for option in SCHEMA["$defs"]["window"]["oneOf"] for k in option["properties"]}
    if section == "on_warning":
        return {k for option in SCHEMA["$defs"]["on_warning"]["oneOf"] for k in option["properties"]}
    node = SCHEMA if _SECTION_DEFS[section] is None else SCHEMA["$defs"][_SECTION_DEFS[section]]
    return set(node["properties"])


@pytest.mark.parametrize("section", sorted(ACCEPTED_FIELDS))
def test_schema_lists_exactly_the_accepted_fields(section: str) -> None:
    """Every key the loader accepts appears in the schema, and the schema lists no key the loader refuses."""
    assert _properties(section) == set(ACCEPTED_FIELDS[section])


@pytest.mark.parametrize("section", sorted(REQUIRED_FIELDS))
def test_schema_required_matches_loader(section: str) -> None:
    """The schema's `required` is the loader's list of required keys."""
    node = SCHEMA if section == "topology" else SCHEMA["$defs"][section]
    assert set(node.get("required", [])) == set(REQUIRED_FIELDS[section])


def test_schema_enums_come_from_the_model() -> None:
    """aggregate, mechanism and accounting list exactly the Enum values."""
    defs = SCHEMA["$defs"]
    assert defs["metric"]["properties"]["aggregate"]["anyOf"][0]["enum"] == [a.value for a in Aggregate]
    assert defs["metric"]["properties"]["mechanism"]["anyOf"][0]["enum"] == [m.value for m in Mechanism]
    assert defs["budget"]["properties"]["accounting"]["anyOf"][0]["enum"] == [a.value for a in Accounting]
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_schema_carries_model_docstrings() -> None:
    """Field descriptions come from the model's attribute docstrings (for editor hovers)."""
    contribution = SCHEMA["$defs"]["contribution"]["properties"]
    assert "L0" in contribution["max_keys"]["description"]
    assert SCHEMA["$defs"]["source"]["properties"]["idle_timeout"]["default"] == "30s"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_schema(path: Path) -> None:
    """The reference topologies are valid instances of the schema."""
    assert _errors(yaml.safe_load(path.read_text()), SCHEMA) == []


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("weight: 3", "wieght: 3", "unexpected 'wieght'"),
        ("aggregate: count_units", "aggregate: median", "matches none of anyOf"),
        ("{tumbling: 1m}", "{tumbling: 1m, every: 1m}", "oneOf"),
        ("bounds: [0, 200]", "bounds: [0]", "fails minItems"),
        ("epsilon: 1.0", "epsilon: 0", "matches none of anyOf"),
        ("    k: 5\n", "", "missing 'k'"),
        ("    value: basket_eur\n", "", "missing 'value'"),
    ],
)
def test_schema_rejects_broken_documents(old: str, new: str, fragment: str) -> None:
    """The schema flags the common mistakes an editor should underline."""
    text = (ROOT / "topology" / "examples" / "web-analytics.yaml").read_text()
    assert old in text
    errors = _errors(yaml.safe_load(text.replace(old, new, 1)), SCHEMA)
    assert any(fragment in e for e in errors), errors


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_topologies())
def test_random_valid_topologies_validate(topology: Topology) -> None:
    """Every topology the loader accepts (as dumped YAML) is valid under the schema."""
    assert _errors(topology_document(topology), SCHEMA) == []


def _example_with_start(start: Any) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "topology" / "examples" / "web-analytics.yaml").read_text())
    return {"version": doc.pop("version"), "start": start, **doc}


def test_schema_documents_start() -> None:
    """`start` is an optional top-level property with a description of both accepted forms."""
    prop = SCHEMA["properties"]["start"]
    assert "start" not in SCHEMA.get("required", [])
    assert "public start" in prop["description"]
    described = SCHEMA["$defs"]["start"]["description"]
    assert "2026-12-01T00:00:00Z" in described and "epoch seconds" in described


@pytest.mark.parametrize(
    "start",
    ["2026-12-01T00:00:00Z", "2026-12-01T00:00:00+00:00", "2026-12-01 00:00Z", 1_796_083_200, "${START}"],
)
def test_schema_accepts_the_start_forms_the_loader_accepts(start: Any) -> None:
    """ISO-8601 UTC strings (as an editor's YAML 1.2 sees them), epoch seconds and env references validate."""
    assert _errors(_example_with_start(start), SCHEMA) == []
    if not isinstance(start, str) or not start.startswith("$"):
        text = yaml.safe_dump(_example_with_start(start), sort_keys=False)
        assert load_topology_text(text, env={}).schedule_start == 1_796_083_200


@pytest.mark.parametrize(
    "start",
    [
        "2026-12-01T00:00:00",
        "2026-12-01T01:00:00+01:00",
        "2026-12-01T00:00:00.5Z",
        "2026-12-01",
        START_MIN_S - 1,
        START_MAX_S,
        1_796_083_200.5,
        True,
    ],
)
def test_schema_rejects_bad_starts(start: Any) -> None:
    """The schema underlines the same start mistakes the loader refuses."""
    assert _errors(_example_with_start(start), SCHEMA) != []


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_topologies(), st.integers(START_MIN_S, START_MAX_S - 1))
def test_random_topologies_with_start_validate(topology: Topology, schedule_start: int) -> None:
    """A dumped topology with a start (written as ISO-8601 with Z) is valid under the schema."""
    assert _errors(topology_document(dataclasses.replace(topology, schedule_start=schedule_start)), SCHEMA) == []
