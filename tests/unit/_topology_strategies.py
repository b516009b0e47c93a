"""Hypothesis strategies for valid topologies (shared by the loader and schema round-trip tests)."""

from __future__ import annotations

__all__ = ["valid_topologies"]

from hypothesis import strategies as st

from dpstream.topology.model import (
    Accounting,
    Aggregate,
    Bounds,
    Budget,
    Contribution,
    KafkaSettings,
    Mechanism,
    Metric,
    PostProcess,
    RedisSettings,
    Sinks,
    Source,
    Topology,
    WarningPolicy,
    Window,
)

_NAMES = st.from_regex(r"[a-z][a-z0-9_.-]{0,8}", fullmatch=True)
_FIELDS = st.sampled_from(["page", "referrer", "country", "amount", "session_s", "basket"])
_KEYS = st.lists(st.from_regex(r"[a-z]{1,6}", fullmatch=True), min_size=1, max_size=5, unique=True)


@st.composite
def _source(draw: st.DrawFn, name: str) -> Source:
    return Source(
        name=name,
        topic=f"in.{name}",
        privacy_unit=draw(st.sampled_from(["user_id", "account_id", "event"])),
        timestamp=draw(st.none() | st.just("ts")),
        allowed_lateness_s=draw(st.sampled_from([0, 5, 10, 60])),
        idle_timeout_s=draw(st.sampled_from([1, 30, 120])),
        keyed_by_unit=draw(st.booleans()),
        max_future_s=draw(st.sampled_from([60, 3600, 86400])),
    )


@st.composite
def _budget(draw: st.DrawFn, name: str) -> Budget:
    accounting = draw(st.sampled_from(list(Accounting)))
    policy = draw(
        st.one_of(
            st.just(WarningPolicy()),
            st.floats(1.01, 5.0).map(lambda s: WarningPolicy(stretch=s)),
            st.integers(2, 5).map(lambda n: WarningPolicy(thin=n)),
        )
    )
    return Budget(
        name=name,
        epsilon=draw(st.floats(0.01, 10.0)),
        delta=draw(st.floats(1e-12, 0.5)) if accounting is Accounting.ZCDP else draw(st.sampled_from([0.0, 1e-6])),
        accounting=accounting,
        period_s=draw(st.sampled_from([3600, 86400, 7 * 86400])),
        reserve=draw(st.floats(0.0, 0.99)),
        warn_at=draw(st.floats(0.01, 1.0)),
        on_warning=policy,
    )


@st.composite
def _metric(draw: st.DrawFn, name: str, sources: list[str], budgets: dict[str, Budget]) -> Metric:
    budget = budgets[draw(st.sampled_from(sorted(budgets)))]
    size = draw(st.sampled_from([60, 300, 900, 3600]))
    every = draw(st.sampled_from([d for d in (60, 300, 900, 3600) if size % d == 0]))
    aggregate = draw(st.sampled_from(list(Aggregate)))
    if aggregate in (Aggregate.TOP_K, Aggregate.QUANTILE):
        mechanism = Mechanism.EXPONENTIAL
    elif budget.accounting is Accounting.ZCDP:
        mechanism = draw(st.sampled_from([Mechanism.LAPLACE, Mechanism.GAUSSIAN]))
    else:
        mechanism = Mechanism.LAPLACE
    numeric = aggregate in (Aggregate.SUM, Aggregate.MEAN, Aggregate.QUANTILE)
    quantile = aggregate is Aggregate.QUANTILE
    lower = draw(st.floats(-1000, 1000)) if numeric else None
    bounds = Bounds(lower, lower + draw(st.floats(0.5, 1000))) if lower is not None else None
    if aggregate is Aggregate.TOP_K:
        group_by: str | None = draw(_FIELDS)
    else:
        group_by = None if quantile else draw(st.none() | _FIELDS)
    keys = tuple(draw(_KEYS)) if group_by is not None and draw(st.booleans()) else None
    if group_by is not None and keys is None and budget.accounting is Accounting.PURE and budget.delta == 0:
        keys = tuple(draw(_KEYS))  # data-derived keys need a δ for partition selection
    k = None
    if aggregate is Aggregate.TOP_K:
        k = draw(st.integers(1, len(keys) if keys else 10))
    max_keys = draw(st.integers(1, 4)) if group_by is not None else 1
    return Metric(
        name=name,
        source=draw(st.sampled_from(sources)),
        budget=budget.name,
        weight=draw(st.floats(0.01, 100.0)),
        window=Window(size, every),
        aggregate=aggregate,
        mechanism=mechanism,
        contribution=Contribution(max_keys, draw(st.integers(1, 5))),
        value=draw(_FIELDS) if numeric else None,
        bounds=bounds,
        denominator=draw(st.none() | st.floats(1.0, 1e6)) if aggregate is Aggregate.MEAN else None,
        group_by=group_by,
        keys=keys,
        k=k,
        may_use_reserve=draw(st.booleans()),
        postprocess=PostProcess(draw(st.booleans()), draw(st.booleans())),
        quantiles=tuple(sorted(draw(st.sets(st.floats(0.01, 0.99), min_size=1, max_size=3)))) if quantile else None,
        candidates=_grid(bounds, draw(st.integers(1, 20))) if quantile and bounds is not None else None,
    )


def _grid(bounds: Bounds, bins: int) -> tuple[float, ...]:
    """The even grid `bins: n` gives over `bounds` (both ends included), as the loader builds it."""
    step = (bounds.upper - bounds.lower) / bins
    return (*(bounds.lower + i * step for i in range(bins)), bounds.upper)


@st.composite
def valid_topologies(draw: st.DrawFn, path: str = "<roundtrip>") -> Topology:
    """A random Topology that satisfies every loader rule (warnings allowed)."""
    source_names = draw(st.lists(_NAMES, min_size=1, max_size=3, unique=True))
    budget_names = draw(st.lists(_NAMES, min_size=1, max_size=2, unique=True))
    metric_names = draw(st.lists(_NAMES, min_size=1, max_size=4, unique=True))
    sources = {n: draw(_source(n)) for n in source_names}
    budgets = {n: draw(_budget(n)) for n in budget_names}
    metrics = {n: draw(_metric(n, source_names, budgets)) for n in metric_names}
    sinks = Sinks("out.releases", "out.dead-letter", draw(st.sampled_from(["", "out.partials"])))
    kafka = draw(st.sampled_from([KafkaSettings(), KafkaSettings("kafka-1:9092,kafka-2:9092")]))
    redis = draw(st.sampled_from([RedisSettings(), RedisSettings("rediss://ledger:6380/2")]))
    return Topology(1, sources, budgets, metrics, sinks, kafka, redis, path)
