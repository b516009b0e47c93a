"""Load a topology YAML file into the frozen model, checking every field with `FILE:LINE:` messages.

`load_topology(path)` is what workers call. Mistakes raise `TopologyError` (a `ConfigError`) whose
message is the first problem in file order; its `problems` lists all of them. Warnings (legal but
probably unintended) come from `load_with_warnings`, which runs `topology.lint.lint_topology`.
"""

from __future__ import annotations

__all__ = [
    "ACCEPTED_FIELDS",
    "REQUIRED_FIELDS",
    "load_topology",
    "load_topology_text",
    "load_with_warnings",
    "load_text_with_warnings",
    "read_topology",
]

import dataclasses
import datetime as dt
import itertools
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dpstream.topology.durations import format_duration
from dpstream.topology.errors import ConfigError, ConfigWarning
from dpstream.topology.lint import lint_topology
from dpstream.topology.model import (
    DEFAULT_PUBLISH_DELAY_S,
    EVENT_LEVEL_UNIT,
    HOURS_PER_DAY,
    KAFKA_SASL_MECHANISMS,
    NAMED_SHAPES,
    Accounting,
    Aggregate,
    Arrival,
    Bounds,
    Budget,
    Contribution,
    HourlyShape,
    KafkaProtocol,
    KafkaSettings,
    Mechanism,
    Metric,
    Partitioner,
    PostProcess,
    RedisSettings,
    ReleaseKind,
    Sinks,
    Source,
    Topology,
    UnitHash,
    WarningPolicy,
    Window,
    WindowKind,
)
from dpstream.topology.readers import (
    FieldProblem,
    is_null,
    read_bool,
    read_duration,
    read_enum,
    read_int,
    read_map,
    read_number,
    read_str,
    show,
    suggest,
)
from dpstream.topology.validation import Problem, SourceMap, TopologyError, check_metric_links
from dpstream.topology.yaml_positions import LocatedError, Map, Node, Scalar, Seq, compose_located

ACCEPTED_FIELDS: dict[str, tuple[str, ...]] = {
    "topology": ("version", "start", "publish_delay", "kafka", "redis", "sources", "budgets", "metrics", "sinks"),
    "source": (
        "topic",
        "privacy_unit",
        "timestamp",
        "allowed_lateness",
        "idle_timeout",
        "keyed_by_unit",
        "max_future",
        "privacy_unit_hash",
        "arrival",
        "partitioner",
    ),
    "budget": (
        "epsilon",
        "delta",
        "accounting",
        "period",
        "reserve",
        "warn_at",
        "on_warning",
        "expected_units",
        "schedule",
    ),
    "metric": (
        "source",
        "budget",
        "weight",
        "window",
        "aggregate",
        "mechanism",
        "contribution",
        "value",
        "bounds",
        "denominator",
        "group_by",
        "keys",
        "k",
        "may_use_reserve",
        "postprocess",
        "quantiles",
        "bins",
        "candidates",
        "schedule",
        "release",
    ),
    "window": ("tumbling", "hopping", "every"),
    "on_warning": ("stretch", "thin"),
    "contribution": ("max_keys", "max_per_key", "max_windows", "max_per_period"),
    "postprocess": ("round", "clamp_zero"),
    "sinks": ("releases", "dead_letter", "partials"),
    "kafka": ("bootstrap", "security_protocol", "sasl_mechanism", "sasl_username", "ssl_cafile"),
    "redis": ("url",),
}
"""Every YAML key the loader accepts, per mapping (the JSON Schema test checks it against the schema)."""

REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "topology": ("version", "sources", "budgets", "metrics", "sinks"),
    "source": ("topic", "privacy_unit"),
    "budget": ("epsilon", "period"),
    "metric": ("source", "budget", "window", "aggregate", "mechanism"),
    "sinks": ("releases", "dead_letter"),
}
"""Keys that must be present (others have defaults, or are required only in some combinations)."""

_SECRET_FIELDS = {
    "sasl_password": "set DPSTREAM_KAFKA_SASL_PASSWORD (or DPSTREAM_KAFKA_SASL_PASSWORD_FILE) in the environment",
    "password": "set it in the environment (DPSTREAM_KAFKA_SASL_PASSWORD, DPSTREAM_REDIS_PASSWORD)",
}
"""Keys that would put a secret in the file: refused with where the secret goes instead."""

_HINTS = {
    "version": "write version: 1 at the top",
    "sources": "declare the input topics under sources:",
    "budgets": "declare at least one budget scope under budgets:",
    "metrics": "declare at least one metric under metrics:",
    "sinks": "declare sinks: {releases: <topic>, dead_letter: <topic>}",
    "topic": "name the Kafka topic, e.g. topic: web.clicks",
    "privacy_unit": "name the field that identifies the protected person, e.g. privacy_unit: user_id",
    "epsilon": "give the budget's ε per period, e.g. epsilon: 1.0",
    "period": "give how often the budget renews, e.g. period: 1d",
    "source": "name the source it reads, e.g. source: clicks",
    "budget": "name the budget it draws on, e.g. budget: web-daily",
    "window": "give a window, e.g. window: {tumbling: 1m} or {hopping: 5m, every: 1m}",
    "aggregate": "choose one of " + ", ".join(a.value for a in Aggregate),
    "mechanism": "choose one of " + ", ".join(m.value for m in Mechanism),
    "releases": "name the output topic, e.g. releases: web.dp-releases",
    "dead_letter": "name the dead-letter topic, e.g. dead_letter: web.dead-letter",
}

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_REDIS_SCHEMES = (
    "redis://",
    "rediss://",
    "unix://",
    "redis+sentinel://",
    "rediss+sentinel://",
    "redis+cluster://",
    "rediss+cluster://",
)
_SECTION_KIND = {"sources": "source", "budgets": "budget", "metrics": "metric"}

START_MIN_S = 946_684_800
"""2000-01-01T00:00:00Z: an earlier `start:` is taken for a typo."""
START_MAX_S = 4_102_444_800
"""2100-01-01T00:00:00Z: a later `start:` is taken for a typo (often epoch milliseconds)."""
_START_EXAMPLE = "start: 2026-12-01T00:00:00Z or start: 1796083200"
_START_TIME = re.compile(
    r"^(?P<date>\d{4}-\d{2}-\d{2})"
    r"(?:[Tt ](?P<hm>\d{2}:\d{2})(?::(?P<sec>\d{2}))?(?P<frac>\.\d*)?)?"
    r"[ \t]*(?P<tz>[Zz]|[+-]\d{2}(?::?\d{2})?)?$"
)
_EPOCH_TEXT = re.compile(r"^\s*[-+]?\d+\s*$")
_EPOCH = dt.datetime(1970, 1, 1)

MAX_EPSILON = 1e6
"""The largest ε a budget may declare: past it ε²/2 and the conversions leave float range."""


def load_topology(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Topology:
    """Read and check a topology file; raise `ConfigError` (one line, `FILE:LINE: ...`) on any mistake."""
    return read_topology(_read_file(path), str(path), env)[0]


def load_topology_text(text: str, path: str = "<string>", env: Mapping[str, str] | None = None) -> Topology:
    """`load_topology` for YAML held in a string; `path` only labels messages."""
    return read_topology(text, path, env)[0]


def load_with_warnings(
    path: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> tuple[Topology, list[ConfigWarning]]:
    """Load a file and lint it: the topology plus its warnings (each `where` is `FILE:LINE`)."""
    return load_text_with_warnings(_read_file(path), str(path), env)


def load_text_with_warnings(
    text: str, path: str = "<string>", env: Mapping[str, str] | None = None
) -> tuple[Topology, list[ConfigWarning]]:
    """`load_with_warnings` for YAML held in a string."""
    topology, source_map = read_topology(text, path, env)
    return topology, lint_topology(topology, source_map)


def read_topology(text: str, path: str, env: Mapping[str, str] | None = None) -> tuple[Topology, SourceMap]:
    """The core: YAML text to (Topology, SourceMap). `env` defaults to `os.environ`."""
    return _Loader(path, os.environ if env is None else env).run(text)


def _read_file(path: str | os.PathLike[str]) -> str:
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{path}: is a directory; give a topology .yaml file")
    try:
        return target.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; check the path") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None


class _Fields:
    """The fields of one entity: reads each with its reader, recording every problem."""

    def __init__(self, loader: _Loader, kind: str, name: str, subject: str, node: Node, line: int) -> None:
        self.loader = loader
        self.subject = subject
        self.line = line
        self.key = (kind, name)
        self.ok = True
        self.nodes: dict[str, Node] = {}
        known = ACCEPTED_FIELDS[kind]
        if not isinstance(node, Map):
            self.fail(node.line, f"{subject} {show(node)}: must be a mapping of fields ({', '.join(known[:4])}, ...)")
            return
        unknown: list[str] = []
        for key, key_line, value in node.entries:
            if key in _SECRET_FIELDS and key not in known:  # its value is never shown
                self.fail(
                    key_line, f"{subject}: {key}: a secret does not belong in the topology file; {_SECRET_FIELDS[key]}"
                )
                unknown.append(key)
                continue
            if key not in known:
                self.fail(key_line, f"{subject}: unknown field '{key}'; {suggest(key, known)}")
                unknown.append(key)
                continue
            self.nodes[key] = value
            loader.lines[(kind, name, key)] = value.line
        for key in REQUIRED_FIELDS.get(kind, ()):
            required = node.get(key)
            if required is None and any(suggest(u, known) == f"did you mean '{key}'?" for u in unknown):
                continue  # a misspelt key already says "did you mean '<key>'?"
            if required is None:
                self.fail(line, f"{subject}: missing field '{key}'; {self._hint(key)}")
            elif is_null(required):
                self.fail(required.line, f"{subject}: {key} is empty; {self._hint(key)}")

    def _hint(self, key: str) -> str:
        """The fix for a missing `key`; a metric's source or budget suggests the names this file declares."""
        declared = sorted({k[1] for k in self.loader.lines if len(k) == 2 and k[0] == key})
        if key not in ("source", "budget") or not declared:
            return _HINTS[key]
        what = "name the source it reads" if key == "source" else "name the budget it draws on"
        if len(declared) == 1:
            return f"{what}, e.g. {key}: {declared[0]}"
        return f"{what}: one of {', '.join(declared)}"

    def fail(self, line: int, text: str) -> None:
        """Record a problem and mark the entity broken."""
        self.loader.problems.append(Problem(line, text))
        self.ok = False

    def bad(self, key: str, problem: str) -> None:
        """Record `<subject>: <key> <value>: <problem>` at the field's line."""
        node = self.nodes[key]
        self.fail(node.line, f"{self.subject}: {key} {show(node)}: {problem}")

    def has(self, key: str) -> bool:
        """The field was given (and is not empty)."""
        return not is_null(self.nodes.get(key))

    def get(self, key: str, reader: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        """The field read by `reader(node, subject, key, *args)`, or `default` when absent or bad."""
        node = self.nodes.get(key)
        if is_null(node):
            return default
        try:
            return reader(node, self.subject, key, *args)
        except FieldProblem as problem:
            self.fail(problem.line, problem.text)
            return default


class _Loader:
    def __init__(self, path: str, env: Mapping[str, str]) -> None:
        self.path = path
        self.env = env
        self.problems: list[Problem] = []
        self.lines: dict[tuple[str, ...], int] = {}
        self.broken: set[tuple[str, str]] = set()
        self.expected_units: dict[str, int] = {}
        self.notes: list[tuple[int, ConfigWarning]] = []
        self.own_schedules: dict[str, HourlyShape] = {}
        """Each metric's own `schedule:` as written (flat included: it overrides its budget's)."""

    def run(self, text: str) -> tuple[Topology, SourceMap]:
        try:
            root = compose_located(text, self.env)
        except LocatedError as exc:
            raise TopologyError(self.path, [Problem(exc.line, exc.message)]) from None
        if root is None:
            raise TopologyError(
                self.path, [Problem(1, "empty topology; write version: 1, sources, budgets, metrics and sinks")]
            )
        if not isinstance(root, Map):
            raise TopologyError(
                self.path,
                [
                    Problem(
                        root.line,
                        f"topology {show(root)}: must be a mapping with version, sources, budgets, metrics, sinks",
                    )
                ],
            )
        top = _Fields(self, "topology", "", "topology", root, 1)
        version = top.get("version", _read_version, default=1)
        start = top.get("start", _read_start)
        publish_delay = top.get("publish_delay", _read_publish_delay, True, default=DEFAULT_PUBLISH_DELAY_S)
        sources = self._section(top, "sources", self._source)
        budgets = self._section(top, "budgets", self._budget)
        metrics = self._section(top, "metrics", self._metric)
        sinks = self._sinks(top.nodes.get("sinks"), sources)
        kafka = self._kafka(top.nodes.get("kafka"))
        redis = self._redis(top.nodes.get("redis"))
        metrics = self._resolve_schedules(metrics, budgets)
        source_map = SourceMap(self.path, dict(self.lines), dict(self.expected_units), tuple(self.notes))
        for metric in metrics.values():
            self.problems.extend(check_metric_links(metric, sources, budgets, self.broken, source_map))
        if self.problems:
            raise TopologyError(self.path, self.problems)
        assert sinks is not None
        topology = Topology(
            version, sources, budgets, metrics, sinks, kafka, redis, self.path, start, publish_delay_s=publish_delay
        )
        return topology, source_map

    def _resolve_schedules(self, metrics: dict[str, Metric], budgets: dict[str, Budget]) -> dict[str, Metric]:
        """Each metric's effective schedule (its own, else its budget's; flat → None), checked against its
        window: a shaped metric's window step must divide a day, so every period weighs its windows alike."""
        out: dict[str, Metric] = {}
        for name, metric in metrics.items():
            budget = budgets.get(metric.budget)
            own = self.own_schedules.get(name)
            schedule = _shaped(own) if own is not None else budget.schedule if budget is not None else None
            if schedule is not None and _DAY_S % metric.window.every_s:
                key = ("metric", name, "schedule") if own is not None else ("metric", name, "window")
                whose = "its schedule" if own is not None else f"budget '{metric.budget}''s schedule"
                self.problems.append(
                    Problem(
                        self.lines.get(key, self.lines.get(("metric", name), 0)),
                        f"metric '{name}': {whose} weighs windows by the UTC hour they start in, so the window "
                        "step must divide a day; use a window such as {tumbling: 1h} or 15m, or schedule: flat",
                    )
                )
            if schedule is not None and own is not None and budget is not None and budget.period_s % _DAY_S:
                self.problems.append(
                    Problem(
                        self.lines.get(("metric", name, "schedule"), 0),
                        f"metric '{name}': schedule: shapes a period by hour of day, but budget '{metric.budget}' "
                        f"renews every {format_duration(budget.period_s)}; give the budget period: 1d or drop schedule",
                    )
                )
            out[name] = metric if schedule is None else dataclasses.replace(metric, schedule=schedule)
        return out

    # --- sections -------------------------------------------------------------------------

    def _section(self, top: _Fields, key: str, parse: Callable[[str, Node, int], Any]) -> dict[str, Any]:
        node = top.nodes.get(key)
        if node is None:
            return {}
        kind = _SECTION_KIND[key]
        if is_null(node):
            return {}
        if isinstance(node, Map) and not node.entries:
            top.fail(node.line, f"{key}: empty; declare at least one {kind}")
            return {}
        if not isinstance(node, Map):
            top.fail(node.line, f"{key} {show(node)}: must be a mapping of {kind} names to their fields")
            return {}
        out: dict[str, Any] = {}
        for name, line, value in node.entries:
            self.lines[(kind, name)] = line
            if not _NAME.match(name):
                self.problems.append(
                    Problem(
                        line,
                        f"{kind} '{name}': bad name: use letters, digits, '_', '-' or '.' (it becomes part of "
                        "Redis keys, topics and metric labels); rename it",
                    )
                )
                self.broken.add((kind, name))
                continue
            built = parse(name, value, line)
            if built is None:
                self.broken.add((kind, name))
            else:
                out[name] = built
        return out

    def _source(self, name: str, node: Node, line: int) -> Source | None:
        f = _Fields(self, "source", name, f"source '{name}'", node, line)
        topic = f.get("topic", read_str)
        unit = f.get("privacy_unit", read_str)
        timestamp = f.get("timestamp", read_str)
        lateness = f.get("allowed_lateness", read_duration, True, default=0)
        idle = f.get("idle_timeout", read_duration, default=30)
        keyed = f.get("keyed_by_unit", read_bool, default=False)
        future = f.get("max_future", read_duration, default=3600)
        unit_hash = f.get("privacy_unit_hash", read_enum, UnitHash)
        if unit_hash is not None and unit == EVENT_LEVEL_UNIT:
            f.bad("privacy_unit_hash", f"has no unit id to hash with privacy_unit: {EVENT_LEVEL_UNIT}; remove it")
        arrival = f.get("arrival", read_enum, Arrival, default=Arrival.APPEND_TIME)
        partitioner = f.get("partitioner", read_enum, Partitioner, default=Partitioner.MURMUR2)
        if f.has("partitioner") and not keyed:
            f.bad("partitioner", "is only read with keyed_by_unit: true (the repartition hop keys the rest); remove it")
        if not f.ok:
            return None
        return Source(
            name, topic, unit, timestamp, lateness, idle, keyed, future, unit_hash, arrival, partitioner=partitioner
        )

    def _budget(self, name: str, node: Node, line: int) -> Budget | None:
        f = _Fields(self, "budget", name, f"budget '{name}'", node, line)
        epsilon = f.get("epsilon", read_number)
        delta = f.get("delta", read_number)
        accounting = f.get("accounting", read_enum, Accounting)
        if accounting is None and not f.has("accounting"):
            accounting = Accounting.ZCDP
        period = f.get("period", read_duration)
        reserve = f.get("reserve", read_number, default=0.2)
        warn_at = f.get("warn_at", read_number, default=0.8)
        policy = f.get("on_warning", _read_policy, default=WarningPolicy())
        units = f.get("expected_units", read_int, 1)
        schedule = f.get("schedule", _read_schedule)
        if schedule is not None and period is not None and period % _DAY_S:
            f.bad("schedule", "shapes a period by hour of day, so the period must be whole days; use period: 1d")
        if epsilon is not None and epsilon <= 0:
            f.bad("epsilon", "must be > 0 (it is the privacy loss allowed per period); e.g. epsilon: 1.0")
        elif epsilon is not None and epsilon > MAX_EPSILON:
            f.bad(
                "epsilon",
                f"must be at most {MAX_EPSILON:g} (far past any privacy, and the accounting would overflow); "
                "e.g. epsilon: 1.0",
            )
        if reserve is not None and not 0 <= reserve < 1:
            f.bad("reserve", "must be in [0, 1): the fraction of the cap kept out of the plan; e.g. reserve: 0.2")
        if warn_at is not None and not 0 < warn_at <= 1:
            f.bad("warn_at", "must be in (0, 1]: the spent fraction that starts the warning state; e.g. warn_at: 0.8")
        delta_node = f.nodes.get("delta")
        if accounting is Accounting.ZCDP:
            if is_null(delta_node):
                f.fail(
                    delta_node.line if delta_node is not None else line,
                    f"budget '{name}': missing field 'delta'; zcdp accounting needs 0 < delta < 1, "
                    "e.g. delta: 1.0e-6 (or use accounting: pure)",
                )
            elif delta == 0:
                f.bad("delta", "zcdp accounting needs 0 < delta < 1, e.g. delta: 1.0e-6; or use accounting: pure")
            elif delta is not None and not 0 < delta < 1:
                f.bad("delta", "must be in (0, 1), and far below 1/number of units; e.g. delta: 1.0e-6")
        elif accounting is Accounting.PURE and delta is not None and delta_node is not None and not 0 <= delta < 1:
            f.bad(
                "delta",
                "must be in [0, 1); pure accounting uses δ only for partition selection of data-derived keys",
            )
        if not f.ok:
            return None
        if units is not None:
            self.expected_units[name] = units
        stored_delta = float(delta) if delta is not None else 0.0
        return Budget(name, epsilon, stored_delta, accounting, period, reserve, warn_at, policy, _shaped(schedule))

    def _metric(self, name: str, node: Node, line: int) -> Metric | None:
        subject = f"metric '{name}'"
        f = _Fields(self, "metric", name, subject, node, line)
        source = f.get("source", read_str)
        budget = f.get("budget", read_str)
        weight = f.get("weight", read_number, default=1.0)
        window = f.get("window", _read_window)
        aggregate = f.get("aggregate", read_enum, Aggregate)
        mechanism = f.get("mechanism", read_enum, Mechanism)
        contribution = f.get("contribution", _read_contribution, default=Contribution())
        value = f.get("value", read_str)
        bounds = f.get("bounds", _read_bounds)
        denominator = f.get("denominator", read_number)
        group_by = f.get("group_by", read_str)
        keys = f.get("keys", _read_keys)
        k = f.get("k", read_int, 1)
        may_use_reserve = f.get("may_use_reserve", read_bool, default=False)
        postprocess = f.get("postprocess", _read_postprocess, default=PostProcess())
        quantiles = f.get("quantiles", _read_quantiles)
        bins = f.get("bins", read_int, 1)
        listed = f.get("candidates", _read_candidates)
        schedule = f.get("schedule", _read_schedule)
        release = f.get("release", read_enum, ReleaseKind, default=ReleaseKind.WINDOW)
        if schedule is not None:
            self.own_schedules[name] = schedule
        if weight is not None and weight <= 0:
            f.bad("weight", "must be > 0 (the metric's share of its budget is weight / sum of weights); e.g. weight: 1")
        if denominator is not None and denominator <= 0:
            f.bad("denominator", "must be > 0 (the public number of units a mean divides by)")
        if not f.ok:
            return None
        _check_metric_combination(f, aggregate, mechanism, contribution, group_by, keys, k)
        _check_release(f, release, aggregate, mechanism, contribution, window, group_by, keys)
        candidates = _quantile_grid(f, aggregate, bounds, quantiles, bins, listed)
        if not f.ok:
            return None
        return Metric(
            name,
            source,
            budget,
            weight,
            window,
            aggregate,
            mechanism,
            contribution,
            value,
            bounds,
            denominator,
            group_by,
            keys,
            k,
            may_use_reserve,
            postprocess,
            quantiles,
            candidates,
            release=release,
        )

    def _sinks(self, node: Node | None, sources: dict[str, Source]) -> Sinks | None:
        if node is None:
            return None
        f = _Fields(self, "sinks", "sinks", "sinks", node, node.line)
        releases = f.get("releases", read_str)
        dead_letter = f.get("dead_letter", read_str)
        partials = f.get("partials", read_str, default="")
        if not f.ok:
            return None
        if releases == dead_letter:
            f.bad("dead_letter", "must differ from releases; give the dead-letter topic its own name")
        inputs = {s.topic: s.name for s in sources.values()}
        for key, topic in (("releases", releases), ("dead_letter", dead_letter), ("partials", partials)):
            if topic in inputs:
                f.bad(key, f"is also the topic of source '{inputs[topic]}' (a feedback loop); use another topic")
        return Sinks(releases, dead_letter, partials) if f.ok else None

    def _kafka(self, node: Node | None) -> KafkaSettings:
        if is_null(node):
            return KafkaSettings()
        assert node is not None  # is_null(None) is True
        f = _Fields(self, "kafka", "kafka", "kafka", node, node.line)
        bootstrap = f.get("bootstrap", read_str, default=KafkaSettings().bootstrap)
        protocol = f.get("security_protocol", read_enum, KafkaProtocol)
        mechanism = f.get("sasl_mechanism", read_str)
        if mechanism is not None and mechanism not in KAFKA_SASL_MECHANISMS:
            f.bad("sasl_mechanism", f"unsupported; use one of {', '.join(KAFKA_SASL_MECHANISMS)}")
        username, cafile = f.get("sasl_username", read_str), f.get("ssl_cafile", read_str)
        return KafkaSettings(bootstrap, protocol, mechanism, username, cafile)

    def _redis(self, node: Node | None) -> RedisSettings:
        if is_null(node):
            return RedisSettings()
        assert node is not None  # is_null(None) is True
        f = _Fields(self, "redis", "redis", "redis", node, node.line)
        url = f.get("url", read_str, default=RedisSettings().url)
        if f.has("url") and f.ok and not url.startswith(_REDIS_SCHEMES):
            f.bad("url", "must start with redis://, rediss://, unix://, redis(s)+sentinel:// or redis(s)+cluster://")
        return RedisSettings(url)


# --- field readers that need more than one scalar ------------------------------------------


MAX_PUBLISH_DELAY_S = 86_400
"""The longest `publish_delay`: a day (a release held longer than a period is not a live feed)."""


def _read_publish_delay(node: Node, subject: str, key: str, allow_zero: bool = True) -> int:
    """`publish_delay`: a duration from 0 to a day (P(w) = C(w) + publish_delay must stay a real time)."""
    delay = read_duration(node, subject, key, allow_zero)
    if delay > MAX_PUBLISH_DELAY_S:
        raise FieldProblem(node.line, f"publish_delay {show(node)}: longer than a day; write e.g. 5s (the default)")
    return delay


def _read_version(node: Node, subject: str, key: str) -> int:
    if isinstance(node, Scalar) and node.value == 1 and type(node.value) is int:
        return 1
    raise FieldProblem(node.line, f"version {show(node)}: unsupported; this dpstream reads version: 1")


def _read_start(node: Node, subject: str, key: str) -> int:
    """`start:` as UTC epoch seconds: ISO-8601 with a zero offset (Z, +00:00) or integer epoch seconds."""
    shown = show(node)
    value = node.value if isinstance(node, Scalar) else None
    if isinstance(node, Scalar) and node.substituted and isinstance(value, str) and _EPOCH_TEXT.match(value):
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if isinstance(node, Scalar) and ":" in node.text:  # YAML 1.1 reads 12:30:00 as sexagesimal 45000
            raise FieldProblem(
                node.line, f"start {shown}: a time of day without a date; write the UTC instant, e.g. {_START_EXAMPLE}"
            )
        return _check_start_range(node, value, "epoch seconds")
    if isinstance(value, str) and _EPOCH_TEXT.match(value):
        raise FieldProblem(
            node.line,
            f"start {shown}: a quoted number is text; write epoch seconds unquoted, e.g. start: {value.strip()}",
        )
    if isinstance(value, float):
        raise FieldProblem(
            node.line, f"start {shown}: must be whole epoch seconds (an integer); e.g. start: {int(value)}"
        )
    if not isinstance(value, (str, dt.date)):  # dt.datetime is a dt.date too (PyYAML reads plain timestamps)
        raise FieldProblem(node.line, f"start {shown}: must be a UTC time; write e.g. {_START_EXAMPLE}")
    assert isinstance(node, Scalar)
    match = _START_TIME.match(node.text.strip())
    if match is None:
        raise FieldProblem(
            node.line, f"start {shown}: not an ISO-8601 UTC time or epoch seconds; write e.g. {_START_EXAMPLE}"
        )
    date, hm, sec, frac, tz = match.group("date", "hm", "sec", "frac", "tz")
    try:
        local = dt.datetime.fromisoformat(f"{date}T{hm or '00:00'}:{sec or '00'}")
    except ValueError as exc:
        raise FieldProblem(
            node.line, f"start {shown}: not a valid date and time ({exc}); e.g. start: 2026-12-01T00:00:00Z"
        ) from None
    if hm is None:
        raise FieldProblem(
            node.line,
            f"start {shown}: a date without a time of day; write the UTC instant, e.g. start: {date}T00:00:00Z",
        )
    if tz is None:
        raise FieldProblem(
            node.line,
            f"start {shown}: no UTC offset (a local time is ambiguous); write it in UTC with Z, "
            f"e.g. start: {local.isoformat()}Z",
        )
    offset = _offset(tz)
    if offset:
        try:
            example = f", e.g. start: {(local - offset).isoformat()}Z"
        except OverflowError:
            example = ""
        raise FieldProblem(node.line, f"start {shown}: offset {tz} is not UTC; write the same instant in UTC{example}")
    if frac is not None:
        raise FieldProblem(
            node.line,
            f"start {shown}: fractional second; start is whole seconds, e.g. start: {local.isoformat()}Z",
        )
    return _check_start_range(node, (local - _EPOCH) // dt.timedelta(seconds=1), "time")


def _offset(tz: str) -> dt.timedelta:
    if tz in ("Z", "z"):
        return dt.timedelta(0)
    digits = tz[1:].replace(":", "")
    minutes = int(digits[:2]) * 60 + int(digits[2:] or 0)
    return dt.timedelta(minutes=-minutes if tz[0] == "-" else minutes)


def _check_start_range(node: Node, seconds: int, what: str) -> int:
    shown = show(node)
    if seconds < START_MIN_S:
        raise FieldProblem(
            node.line,
            f"start {shown}: {what} before 2000-01-01T00:00:00Z (a typo?); give the deployment's real start, "
            f"e.g. {_START_EXAMPLE}",
        )
    if seconds >= START_MAX_S:
        hint = ""
        if START_MIN_S <= seconds // 1000 < START_MAX_S:
            hint = f"; epoch milliseconds? in seconds that is start: {seconds // 1000}"
        raise FieldProblem(
            node.line,
            f"start {shown}: {what} after 2100-01-01T00:00:00Z (a typo?){hint}; e.g. {_START_EXAMPLE}",
        )
    return seconds


def _read_window(node: Node, subject: str, key: str) -> Window:
    example = "{tumbling: 1m} or {hopping: 5m, every: 1m}"
    mapping = read_map(node, subject, key, ACCEPTED_FIELDS["window"], example)
    shown = show(node)
    kinds = [k for k in ("tumbling", "hopping") if mapping.get(k) is not None]
    if len(kinds) != 1:
        problem = "give exactly one of tumbling or hopping"
        raise FieldProblem(node.line, f"{subject}: window {shown}: {problem}, e.g. window: {example}")
    size_node = mapping.get(kinds[0])
    assert size_node is not None  # kinds holds the given one
    size = read_duration(size_node, subject, f"window.{kinds[0]}")
    every_node = mapping.get("every")
    if kinds[0] == "tumbling":
        if every_node is not None:
            raise FieldProblem(
                every_node.line,
                f"{subject}: window {shown}: 'every' belongs to hopping windows; write {{hopping: ..., every: ...}} "
                "or drop every",
            )
        return Window(size, size)
    if every_node is None:
        raise FieldProblem(
            node.line, f"{subject}: window {shown}: a hopping window needs every, e.g. {{hopping: 5m, every: 1m}}"
        )
    every = read_duration(every_node, subject, "window.every")
    if every > size:
        raise FieldProblem(
            node.line, f"{subject}: window {shown}: every must not exceed the hopping size (gaps would drop events)"
        )
    if size % every:
        raise FieldProblem(
            node.line, f"{subject}: window {shown}: every must divide the hopping size, e.g. {{hopping: 5m, every: 1m}}"
        )
    return Window(size, every)


_DAY_S = 86_400
_SCHEDULE_EXAMPLE = '{hours: {"08-20": 2}} (unlisted hours weigh 1), a list of 24 weights, or business_hours'
_HOUR_RANGE = re.compile(r"^\s*(\d{1,2})\s*(?:-\s*(\d{1,2})\s*)?$")


def _shaped(schedule: HourlyShape | None) -> HourlyShape | None:
    """The shape as the model holds it: None when flat (every hour alike: today's allocation)."""
    if schedule is None or len(set(schedule.hours)) == 1:
        return None
    return schedule


def _read_schedule(node: Node, subject: str, key: str) -> HourlyShape:
    """`schedule:` as a named shape, a list of 24 weights, or {hours: {"HH-HH": weight, "HH": weight}}."""
    if isinstance(node, Scalar) and isinstance(node.value, str):
        name = node.value.strip()
        if name not in NAMED_SHAPES:
            raise FieldProblem(
                node.line, f"{subject}: schedule {show(node)}: unknown shape; {suggest(name, tuple(NAMED_SHAPES))}"
            )
        return HourlyShape(NAMED_SHAPES[name], name)
    if isinstance(node, Seq):
        if len(node.items) != HOURS_PER_DAY:
            raise FieldProblem(
                node.line,
                f"{subject}: schedule: a list needs 24 weights (hour 0 UTC first), got {len(node.items)}; "
                f"or write {_SCHEDULE_EXAMPLE}",
            )
        return HourlyShape(
            tuple(_schedule_weight(item, subject, f"schedule[{i}]") for i, item in enumerate(node.items))
        )
    mapping = read_map(node, subject, key, ("hours",), _SCHEDULE_EXAMPLE)
    hours = mapping.get("hours")
    if not isinstance(hours, Map) or not hours.entries:
        raise FieldProblem(
            node.line,
            f"{subject}: schedule {show(node)}: needs hours: a mapping of UTC hours to weights, "
            f"e.g. schedule: {_SCHEDULE_EXAMPLE}",
        )
    weights: list[float | None] = [None] * HOURS_PER_DAY
    for text, line, value in hours.entries:
        lo, hi = _hour_range(text, line, subject)
        weight = _schedule_weight(value, subject, f"schedule.hours.{text}")
        for hour in range(lo, hi):
            if weights[hour] is not None:
                raise FieldProblem(
                    line,
                    f"{subject}: schedule.hours '{text}': hour {hour:02d} is listed twice; give each hour one weight",
                )
            weights[hour] = weight
    return HourlyShape(tuple(1.0 if w is None else w for w in weights))


def _hour_range(text: str, line: int, subject: str) -> tuple[int, int]:
    """'08-20' → hours 8..19 (UTC, end excluded); '13' → hour 13 alone."""
    match = _HOUR_RANGE.match(text)
    if match is not None:
        lo = int(match.group(1))
        hi = lo + 1 if match.group(2) is None else int(match.group(2))
        if 0 <= lo < hi <= HOURS_PER_DAY:
            return lo, hi
    raise FieldProblem(
        line,
        f"{subject}: schedule.hours '{text}': not an hour range; write 'HH-HH' with 00 <= start < end <= 24 "
        "(UTC, end excluded; split a range past midnight in two, e.g. '22-24' and '00-06') or one hour 'HH'",
    )


def _schedule_weight(node: Node, subject: str, field: str) -> float:
    weight = read_number(node, subject, field)
    if weight <= 0:
        raise FieldProblem(
            node.line, f"{subject}: {field} {show(node)}: a weight must be > 0 (a window's relative share); e.g. 2"
        )
    return weight


def _read_policy(node: Node, subject: str, key: str) -> WarningPolicy:
    mapping = read_map(node, subject, key, ACCEPTED_FIELDS["on_warning"], "{stretch: 1.5}")
    given = [k for k in ("stretch", "thin") if not is_null(mapping.get(k))]
    if len(given) != 1:
        raise FieldProblem(
            node.line,
            f"{subject}: on_warning {show(node)}: give exactly one of stretch or thin, "
            "e.g. {stretch: 1.5} or {thin: 2}",
        )
    value = mapping.get(given[0])
    assert value is not None
    if given[0] == "stretch":
        stretch = read_number(value, subject, "on_warning.stretch")
        if stretch <= 1:
            raise FieldProblem(
                value.line,
                f"{subject}: on_warning.stretch {show(value)}: must be > 1 (it multiplies the noise); e.g. 1.5",
            )
        return WarningPolicy(stretch=stretch)
    return WarningPolicy(thin=read_int(value, subject, "on_warning.thin", 2))


def _read_contribution(node: Node, subject: str, key: str) -> Contribution:
    mapping = read_map(node, subject, key, ACCEPTED_FIELDS["contribution"], "{max_keys: 1, max_per_key: 1}")
    values = {
        name: read_int(value, subject, f"contribution.{name}", 1)
        for name, _, value in mapping.entries
        if not is_null(value)
    }
    return Contribution(**values)


def _read_postprocess(node: Node, subject: str, key: str) -> PostProcess:
    mapping = read_map(node, subject, key, ACCEPTED_FIELDS["postprocess"], "{round: true, clamp_zero: true}")
    values = {
        name: read_bool(value, subject, f"postprocess.{name}")
        for name, _, value in mapping.entries
        if not is_null(value)
    }
    return PostProcess(**values)


def _read_bounds(node: Node, subject: str, key: str) -> Bounds:
    if not isinstance(node, Seq) or len(node.items) != 2:
        raise FieldProblem(node.line, f"{subject}: bounds {show(node)}: must be [lower, upper], e.g. bounds: [0, 100]")
    lower = read_number(node.items[0], subject, "bounds[0]")
    upper = read_number(node.items[1], subject, "bounds[1]")
    if lower >= upper:
        first, second = node.items
        assert isinstance(first, Scalar) and isinstance(second, Scalar)  # read_number accepted both
        example = f"[{second.text}, {first.text}]" if upper < lower else "[0, 100]"
        raise FieldProblem(
            node.line,
            f"{subject}: bounds {show(node)}: lower bound must be below upper bound; e.g. bounds: {example}",
        )
    return Bounds(lower, upper)


def _read_keys(node: Node, subject: str, key: str) -> tuple[str, ...]:
    if not isinstance(node, Seq) or not node.items:
        raise FieldProblem(
            node.line, f"{subject}: keys {show(node)}: must be a non-empty list, e.g. keys: [home, search]"
        )
    seen: set[str] = set()
    out: list[str] = []
    for item in node.items:
        name = read_str(item, subject, "keys[]")
        if name in seen:
            raise FieldProblem(item.line, f"{subject}: keys: duplicate key '{name}'; list each key once")
        seen.add(name)
        out.append(name)
    return tuple(out)


MAX_QUANTILE_CANDIDATES = 10_000
"""Most candidates a quantile grid may have (each is scored per release, and the rank-error bound
grows with the log of their number)."""


def _read_quantiles(node: Node, subject: str, key: str) -> tuple[float, ...]:
    """Quantile levels: a non-empty list of distinct numbers strictly between 0 and 1, kept ascending."""
    example = "quantiles: [0.5, 0.9, 0.99]"
    if not isinstance(node, Seq) or not node.items:
        raise FieldProblem(node.line, f"{subject}: quantiles {show(node)}: must be a non-empty list, e.g. {example}")
    levels: list[float] = []
    for item in node.items:
        alpha = read_number(item, subject, "quantiles[]")
        if not 0.0 < alpha < 1.0:
            raise FieldProblem(
                item.line, f"{subject}: quantiles: {show(item)} must be strictly between 0 and 1, e.g. 0.5"
            )
        if alpha in levels:
            raise FieldProblem(item.line, f"{subject}: quantiles: duplicate level {show(item)}; list each level once")
        levels.append(alpha)
    return tuple(sorted(levels))


def _read_candidates(node: Node, subject: str, key: str) -> tuple[float, ...]:
    """An explicit candidate grid: at least two numbers, strictly increasing."""
    if not isinstance(node, Seq) or len(node.items) < 2:
        raise FieldProblem(
            node.line,
            f"{subject}: candidates {show(node)}: must list at least two numbers, e.g. candidates: [0, 10, 60]",
        )
    values = [read_number(item, subject, "candidates[]") for item in node.items]
    for item, (a, b) in zip(node.items[1:], itertools.pairwise(values), strict=True):
        if b <= a:
            raise FieldProblem(
                item.line, f"{subject}: candidates: {show(item)} must be above {a:g}; list them ascending"
            )
    if len(values) > MAX_QUANTILE_CANDIDATES:
        raise FieldProblem(node.line, f"{subject}: candidates: at most {MAX_QUANTILE_CANDIDATES:,} candidates")
    return tuple(values)


def _quantile_grid(
    f: _Fields,
    aggregate: Aggregate | None,
    bounds: Bounds | None,
    quantiles: tuple[float, ...] | None,
    bins: int | None,
    listed: tuple[float, ...] | None,
) -> tuple[float, ...] | None:
    """A quantile metric's public candidate grid: `bins` equal steps over `bounds` (both ends
    included), or the `candidates` listed, which must lie inside `bounds`. Other aggregates refuse
    the quantile fields."""
    if aggregate is not Aggregate.QUANTILE:
        agg = aggregate.value if aggregate is not None else "not quantile"
        for key in ("quantiles", "bins", "candidates"):
            if f.has(key):
                f.bad(
                    key,
                    f"only a quantile metric uses {key}; remove it (aggregate is {agg})",
                )
        return None
    if quantiles is None and not f.has("quantiles"):
        f.fail(
            f.line,
            f"{f.subject}: missing field 'quantiles'; aggregate quantile needs its levels, e.g. quantiles: [0.5, 0.9]",
        )
    if f.has("bins") and f.has("candidates"):
        f.bad("candidates", "give either bins (an even grid over bounds) or candidates (a list), not both")
        return None
    if not f.has("bins") and not f.has("candidates"):
        f.fail(
            f.line,
            f"{f.subject}: missing field 'bins'; aggregate quantile needs a public candidate grid, "
            "e.g. bins: 100 (or candidates: [0, 10, 60, 600])",
        )
        return None
    if bounds is None:
        return None
    if bins is not None:
        if bins + 1 > MAX_QUANTILE_CANDIDATES:
            f.bad("bins", f"must be at most {MAX_QUANTILE_CANDIDATES - 1:,}")
            return None
        step = (bounds.upper - bounds.lower) / bins
        return (*(bounds.lower + i * step for i in range(bins)), bounds.upper)
    if listed is None:
        return None
    if listed[0] < bounds.lower or listed[-1] > bounds.upper:
        f.bad("candidates", f"must lie inside bounds [{bounds.lower:g}, {bounds.upper:g}]; drop or move the others")
        return None
    return listed


def _check_release(
    f: _Fields,
    release: ReleaseKind,
    aggregate: Aggregate,
    mechanism: Mechanism,
    contribution: Contribution,
    window: Window,
    group_by: str | None,
    keys: tuple[str, ...] | None,
) -> None:
    """`release: running_total` needs a count or sum, the Gaussian, a tumbling step, declared keys and
    `contribution.max_per_period`; `max_per_period` means nothing without it."""
    if release is not ReleaseKind.RUNNING_TOTAL:
        if contribution.max_per_period is not None:
            f.bad(
                "contribution",
                "max_per_period bounds a unit over a running total's period; add release: running_total or remove it",
            )
        return
    if aggregate not in (Aggregate.COUNT, Aggregate.SUM):
        f.bad("release", f"a running total adds up counts or sums; use aggregate: count or sum (not {aggregate.value})")
    if mechanism is not Mechanism.GAUSSIAN:
        f.bad("mechanism", "a running total is one Gaussian matrix mechanism a period (zCDP); use mechanism: gaussian")
    if window.kind is not WindowKind.TUMBLING:
        f.bad("window", "a running total steps through the period; use a tumbling step such as window: {tumbling: 1m}")
    if group_by is not None and keys is None:
        f.bad("group_by", "a running total releases a fixed set of keys; declare them, e.g. keys: [web, app]")
    if contribution.max_windows is not None:
        f.bad("contribution", "a running total bounds a unit by max_per_period, not max_windows; remove max_windows")
    if contribution.max_per_period is None:
        f.fail(
            f.line,
            f"{f.subject}: missing field 'contribution.max_per_period'; a running total needs a unit's bound over "
            "the period, e.g. contribution: {max_per_period: 10}",
        )


def _check_metric_combination(
    f: _Fields,
    aggregate: Aggregate,
    mechanism: Mechanism,
    contribution: Contribution,
    group_by: str | None,
    keys: tuple[str, ...] | None,
    k: int | None,
) -> None:
    """Rules between a metric's own fields (aggregate vs mechanism, value, bounds, k, keys)."""
    agg = aggregate.value
    selects = (Aggregate.TOP_K, Aggregate.QUANTILE)
    if mechanism is Mechanism.EXPONENTIAL and aggregate not in selects:
        f.bad(
            "mechanism",
            f"the exponential mechanism selects top-k keys only (and quantiles); use laplace or gaussian for {agg}",
        )
    if aggregate in selects and mechanism is not Mechanism.EXPONENTIAL:
        what = "chooses its keys" if aggregate is Aggregate.TOP_K else "chooses each quantile among its candidates"
        f.bad("mechanism", f"{agg} {what} with the exponential mechanism; use mechanism: exponential")
    if aggregate is Aggregate.QUANTILE and group_by is not None:
        f.bad("group_by", "a quantile metric is released ungrouped (keyed quantiles are not supported yet); remove it")
    numeric = aggregate in (Aggregate.SUM, Aggregate.MEAN, Aggregate.QUANTILE)
    for key, example in (("value", "value: amount"), ("bounds", "bounds: [0, 100]")):
        if numeric and not f.has(key):
            what = "the event field to aggregate" if key == "value" else "clamping bounds that limit one event"
            f.fail(f.line, f"{f.subject}: missing field '{key}'; aggregate {agg} needs {what}, e.g. {example}")
        elif not numeric and f.has(key):
            f.bad(key, f"aggregate {agg} does not use {key}; remove it (or use aggregate sum, mean or quantile)")
    if f.has("denominator") and aggregate is not Aggregate.MEAN:
        f.bad("denominator", f"only a mean has a denominator; remove it (aggregate is {agg})")
    if aggregate is Aggregate.TOP_K:
        if k is None:
            f.fail(f.line, f"{f.subject}: missing field 'k'; top_k needs how many keys to release, e.g. k: 5")
        if group_by is None:
            f.fail(
                f.line,
                f"{f.subject}: missing field 'group_by'; top_k needs the field whose values it ranks, "
                "e.g. group_by: page",
            )
        if k is not None and keys is not None and k > len(keys):
            f.bad("k", f"exceeds the {len(keys)} declared keys; lower k or declare more keys")
    elif f.has("k"):
        f.bad("k", f"only top_k uses k; remove it (aggregate is {agg})")
    if keys is not None and group_by is None:
        f.bad("keys", "keys are values of group_by; add group_by: <field> or remove keys")
    if group_by is None and contribution.max_keys > 1:
        f.bad("contribution", "max_keys bounds distinct group_by keys per unit; without group_by use max_keys: 1")
