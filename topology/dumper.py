"""Write a Topology back as YAML in the loader's format (load(dump(t)) == t).

Used by the round-trip tests and by tools that generate or normalise topology files.
"""

from __future__ import annotations

__all__ = ["topology_document", "dump_topology", "format_start"]

import datetime as dt
from typing import Any

import yaml

from dpstream.topology.durations import format_duration
from dpstream.topology.model import (
    DEFAULT_PUBLISH_DELAY_S,
    Accounting,
    Budget,
    Contribution,
    HourlyShape,
    KafkaSettings,
    Metric,
    PostProcess,
    RedisSettings,
    Source,
    Topology,
    WarningPolicy,
    WindowKind,
)


def topology_document(topology: Topology) -> dict[str, Any]:
    """The YAML-shaped dict of a topology (defaults left out, durations as `5m`)."""
    doc: dict[str, Any] = {"version": topology.version}
    if topology.schedule_start is not None:
        doc["start"] = format_start(topology.schedule_start)
    if topology.publish_delay_s != DEFAULT_PUBLISH_DELAY_S:
        doc["publish_delay"] = format_duration(topology.publish_delay_s)
    if topology.kafka != KafkaSettings():
        kafka = topology.kafka
        doc["kafka"] = {"bootstrap": kafka.bootstrap}
        if kafka.security_protocol is not None:
            doc["kafka"]["security_protocol"] = kafka.security_protocol.value
        for key in ("sasl_mechanism", "sasl_username", "ssl_cafile"):
            if getattr(kafka, key) is not None:
                doc["kafka"][key] = getattr(kafka, key)
    if topology.redis != RedisSettings():
        doc["redis"] = {"url": topology.redis.url}
    doc["sources"] = {name: _source(s) for name, s in topology.sources.items()}
    doc["budgets"] = {name: _budget(b) for name, b in topology.budgets.items()}
    doc["metrics"] = {name: _metric(m, topology.budgets.get(m.budget)) for name, m in topology.metrics.items()}
    sinks: dict[str, Any] = {"releases": topology.sinks.releases, "dead_letter": topology.sinks.dead_letter}
    if topology.sinks.partials:
        sinks["partials"] = topology.sinks.partials
    doc["sinks"] = sinks
    return doc


def dump_topology(topology: Topology) -> str:
    """YAML text that `topology.loader.load_topology_text` reads back to an equal Topology."""
    return yaml.safe_dump(topology_document(topology), sort_keys=False, allow_unicode=True)


def format_start(schedule_start: int) -> str:
    """`start:` as the loader reads it back: ISO-8601 UTC with Z (1796083200 -> '2026-12-01T00:00:00Z')."""
    return dt.datetime.fromtimestamp(schedule_start, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _source(source: Source) -> dict[str, Any]:
    out: dict[str, Any] = {"topic": source.topic, "privacy_unit": source.privacy_unit}
    if source.timestamp is not None:
        out["timestamp"] = source.timestamp
    if source.allowed_lateness_s:
        out["allowed_lateness"] = format_duration(source.allowed_lateness_s)
    if source.idle_timeout_s != Source("", "", "").idle_timeout_s:
        out["idle_timeout"] = format_duration(source.idle_timeout_s)
    if source.keyed_by_unit:
        out["keyed_by_unit"] = True
    if source.max_future_s != Source("", "", "").max_future_s:
        out["max_future"] = format_duration(source.max_future_s)
    if source.privacy_unit_hash is not None:
        out["privacy_unit_hash"] = source.privacy_unit_hash.value
    if source.partitioner is not Source("", "", "").partitioner:
        out["partitioner"] = source.partitioner.value
    if source.create_time_arrival:
        out["arrival"] = source.arrival.value
    return out


def _budget(budget: Budget) -> dict[str, Any]:
    out: dict[str, Any] = {"epsilon": budget.epsilon}
    if budget.accounting is Accounting.ZCDP or budget.delta > 0:
        out["delta"] = budget.delta
    out["accounting"] = budget.accounting.value
    out["period"] = format_duration(budget.period_s)
    out["reserve"] = budget.reserve
    out["warn_at"] = budget.warn_at
    if budget.on_warning.stretch != WarningPolicy().stretch:
        out["on_warning"] = {"stretch": budget.on_warning.stretch}
    elif budget.on_warning.thin != WarningPolicy().thin:
        out["on_warning"] = {"thin": budget.on_warning.thin}
    if budget.schedule is not None:
        out["schedule"] = _schedule(budget.schedule)
    return out


def _schedule(shape: HourlyShape) -> Any:
    """A named shape by its name, any other as its 24 weights."""
    return shape.name if shape.name is not None else list(shape.hours)


def _metric(metric: Metric, budget: Budget | None = None) -> dict[str, Any]:
    window = metric.window
    out: dict[str, Any] = {
        "source": metric.source,
        "budget": metric.budget,
        "weight": metric.weight,
        "window": (
            {"tumbling": format_duration(window.size_s)}
            if window.kind is WindowKind.TUMBLING
            else {"hopping": format_duration(window.size_s), "every": format_duration(window.every_s)}
        ),
        "aggregate": metric.aggregate.value,
        "mechanism": metric.mechanism.value,
    }
    if metric.contribution != Contribution():
        out["contribution"] = {
            "max_keys": metric.contribution.max_keys,
            "max_per_key": metric.contribution.max_per_key,
        }
        if metric.contribution.max_windows is not None:
            out["contribution"]["max_windows"] = metric.contribution.max_windows
        if metric.contribution.max_per_period is not None:
            out["contribution"]["max_per_period"] = metric.contribution.max_per_period
    if metric.running_total:
        out["release"] = metric.release.value
    optional = {
        "value": metric.value,
        "bounds": [metric.bounds.lower, metric.bounds.upper] if metric.bounds else None,
        "denominator": metric.denominator,
        "group_by": metric.group_by,
        "keys": list(metric.keys) if metric.keys is not None else None,
        "k": metric.k,
        "quantiles": list(metric.quantiles) if metric.quantiles is not None else None,
        "candidates": list(metric.candidates) if metric.candidates is not None else None,
    }
    out.update({key: value for key, value in optional.items() if value is not None})
    if metric.may_use_reserve:
        out["may_use_reserve"] = True
    if metric.postprocess != PostProcess():
        out["postprocess"] = {"round": metric.postprocess.round, "clamp_zero": metric.postprocess.clamp_zero}
    if metric.schedule != (budget.schedule if budget is not None else None):
        out["schedule"] = "flat" if metric.schedule is None else _schedule(metric.schedule)
    return out
