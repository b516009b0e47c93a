"""The typed topology: what is released, from which source, charged to which budget.

Everything here is a frozen dataclass or an Enum, built once by `topology.loader` from YAML.
The loader checks every field and combination (with file:line in its messages); the model
only holds the values and answers derived questions (window counts, overlap, key lists).
"""

from __future__ import annotations

__all__ = [
    "Accounting",
    "Aggregate",
    "ReleaseKind",
    "Mechanism",
    "WindowKind",
    "UnitHash",
    "Partitioner",
    "Arrival",
    "EVENT_LEVEL_UNIT",
    "EVENT_LEVEL_LABEL",
    "UNIT_LEVEL_LABEL",
    "guarantee_label",
    "charged_windows",
    "event_level_note",
    "DEFAULT_PUBLISH_DELAY_S",
    "Window",
    "WarningPolicy",
    "HOURS_PER_DAY",
    "NAMED_SHAPES",
    "HourlyShape",
    "Budget",
    "Contribution",
    "Bounds",
    "PostProcess",
    "Source",
    "Metric",
    "quantile_label",
    "Sinks",
    "KafkaProtocol",
    "KafkaSettings",
    "RedisSettings",
    "Topology",
]

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from enum import Enum

EVENT_LEVEL_UNIT = "event"
"""`privacy_unit: event` means event-level DP: weaker, chosen explicitly, labelled everywhere."""

DEFAULT_PUBLISH_DELAY_S = 5
"""`publish_delay` when the topology omits it: a worker checks for closed windows every second,
half a second after C(w), and the merge, charge and publish take tens of milliseconds on a healthy
worker (p99 close -> publish under 0.1 s measured): 5 s leaves it a wide margin."""

EVENT_LEVEL_LABEL = "event-level (weaker)"
"""The label of a source, metric or scope with `privacy_unit: event` wherever a figure of it shows."""

UNIT_LEVEL_LABEL = "unit-level"
"""The label of the others: every event of one privacy unit is protected together."""


def guarantee_label(event_level: bool) -> str:
    """`EVENT_LEVEL_LABEL` for an event-level source, metric or scope, else `UNIT_LEVEL_LABEL`."""
    return EVENT_LEVEL_LABEL if event_level else UNIT_LEVEL_LABEL


def event_level_note(metrics: list[str]) -> str:
    """The line that names event-level metrics where a scope's figures show (status, report, verify)."""
    return f"{EVENT_LEVEL_LABEL}: {', '.join(metrics)} protect single events, not people (privacy_unit: event)"


class Accounting(Enum):
    """How a budget scope adds up its releases."""

    ZCDP = "zcdp"
    """Zero-concentrated DP: costs are ρ, they add up, the cap ρ* comes from (ε, δ) by CKS20."""
    PURE = "pure"
    """Pure ε-DP (δ = 0): ε adds up; Laplace and exponential mechanisms only."""


class ReleaseKind(Enum):
    """What a metric's release of a window is."""

    WINDOW = "window"
    """The window's own aggregate, each window its own release (the default)."""
    RUNNING_TOTAL = "running_total"
    """The total from the period start through this step (count and sum on a tumbling step, declared
    keys, zCDP): one Gaussian matrix mechanism per period, charged whole with its first step."""


class Aggregate(Enum):
    """What a metric computes over the bounded events of one window."""

    COUNT = "count"
    """Number of (bounded) events; per key when `group_by` is set (a histogram)."""
    COUNT_UNITS = "count_units"
    """Number of distinct privacy units in the window; each unit counts once."""
    SUM = "sum"
    """Sum of the clamped `value` field."""
    MEAN = "mean"
    """Mean of the clamped `value`: over a public `denominator`, or noisy sum / noisy count."""
    TOP_K = "top_k"
    """The k most frequent `group_by` keys, chosen by the exponential mechanism."""
    QUANTILE = "quantile"
    """Quantiles of the clamped `value` (`quantiles: [0.5, 0.9]`), each a candidate of a public grid
    chosen by OpenDP's private quantile (quantile score + noisy max, the exponential mechanism)."""


class Mechanism(Enum):
    """The noise mechanism a metric's release uses."""

    LAPLACE = "laplace"
    """Discrete Laplace on integers (pure ε-DP; in a zCDP scope it costs ε²/2)."""
    GAUSSIAN = "gaussian"
    """Discrete Gaussian on integers (zCDP only; ρ = Δ₂²/(2σ²))."""
    EXPONENTIAL = "exponential"
    """Exponential mechanism: noisy top-k, private quantiles (pure ε; ε²/8 in zCDP)."""


class KafkaProtocol(Enum):
    """Kafka's `security.protocol` of every client of a deployment."""

    PLAINTEXT = "PLAINTEXT"
    """No TLS, no authentication (a loopback test broker only)."""
    SSL = "SSL"
    """TLS; the broker may authenticate the client by its certificate."""
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    """SASL authentication without TLS: SCRAM hides the password, the data is not encrypted."""
    SASL_SSL = "SASL_SSL"
    """SASL authentication inside TLS (the production setting)."""

    @property
    def tls(self) -> bool:
        """True when the connection is encrypted."""
        return self in (KafkaProtocol.SSL, KafkaProtocol.SASL_SSL)

    @property
    def sasl(self) -> bool:
        """True when the client authenticates with a user name and password."""
        return self in (KafkaProtocol.SASL_PLAINTEXT, KafkaProtocol.SASL_SSL)


KAFKA_SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
"""SASL mechanisms the Kafka clients speak (SCRAM-SHA-512 is the default)."""


class UnitHash(Enum):
    """How a source's privacy unit ids are replaced at ingest, before anything stores or forwards them."""

    HMAC_SHA256 = "hmac-sha256"
    """HMAC-SHA-256 keyed by the secret in the environment variable DPSTREAM_UNIT_HMAC_KEY (the same on
    every worker): the repartition hop, internal topics and the bounding state see only the keyed hash."""


class Arrival(Enum):
    """Which record time of a source topic counts as an event's arrival (its inclusion time)."""

    APPEND_TIME = "append_time"
    """The broker's append time (topic `message.timestamp.type=LogAppendTime`): inclusion depends on the
    event alone, whatever the worker's load or the other units' traffic (the default)."""
    CREATE_TIME = "create_time"
    """The producer's time (a CreateTime topic), chosen explicitly and labelled weaker: a record stamped
    at or before a window's close but appended after it counts only if it lands before the worker reads
    the end offset, which depends on the worker's load, i.e. on other units' traffic."""


class Partitioner(Enum):
    """How the producers of a `keyed_by_unit` source pick a record's partition from its key: the
    worker dead-letters a record that is not in its key's partition (`wrong_partition`), since one
    unit on two partitions would be bounded once per partition."""

    MURMUR2 = "murmur2"
    """murmur2 of the key, made positive, mod the partition count: the default of the Java client,
    Kafka Streams, aiokafka and kafka-python, and librdkafka's `partitioner=murmur2_random`."""
    CRC32 = "crc32"
    """CRC-32 of the key mod the partition count: librdkafka's default (`consistent_random`), so
    confluent-kafka (Python, Go, .NET) and other librdkafka-based clients unless reconfigured."""


class WindowKind(Enum):
    """Shape of an event-time window."""

    TUMBLING = "tumbling"
    """Back-to-back windows; each event falls in exactly one."""
    HOPPING = "hopping"
    """Windows of `size` starting every `every`; each event falls in size/every windows."""


@dataclass(frozen=True)
class Window:
    """An event-time window, in whole seconds, aligned to the UTC epoch."""

    size_s: int
    every_s: int

    @property
    def kind(self) -> WindowKind:
        """Tumbling when a window starts exactly where the previous one ends."""
        return WindowKind.TUMBLING if self.every_s == self.size_s else WindowKind.HOPPING

    @property
    def overlap(self) -> int:
        """How many windows one event falls into (1 for tumbling)."""
        return self.size_s // self.every_s

    def releases_per_period(self, period_s: int) -> int:
        """Window releases whose start lies in one budget period."""
        return period_s // self.every_s

    def straddles(self, period_s: int) -> bool:
        """True when some window of the grid overlaps two periods of `period_s` seconds.

        Windows start on multiples of every_s and periods on multiples of period_s (both from the UTC
        epoch), so window starts reach exactly the period offsets that are multiples of
        g = gcd(every_s, period_s); the last of them below the period's end is period_s − g, and that
        window crosses the boundary iff it is longer than g. With a size that divides the period (the
        loader's rule) this is every hopping window, and no tumbling one.
        """
        return self.size_s > math.gcd(self.every_s, period_s)

    def starts_covering(self, ts: float) -> range:
        """Start times (seconds) of every window that contains event time `ts`."""
        last = int(ts // self.every_s) * self.every_s
        first = last - self.size_s + self.every_s
        return range(first, last + 1, self.every_s)


@dataclass(frozen=True)
class WarningPolicy:
    """What a scope does once its ratio reaches `warn_at`: stretch noise, or thin releases."""

    stretch: float = 1.0
    """Multiply σ (or the Laplace scale) by this; the cost falls by its square (zCDP) or itself (pure)."""
    thin: int = 1
    """Release only every n-th window while in warning."""


HOURS_PER_DAY = 24


@dataclass(frozen=True)
class HourlyShape:
    """A budget schedule (`schedule:`): public weights by UTC hour of day that shape how a period's pool
    is spread over a metric's windows. Never derived from traffic.

    Window → weight: a window weighs the weight of the UTC hour of day its start falls in,
    hours[(start mod 86 400) // 3 600]. Periods are UTC-aligned multiples of the period from epoch 0;
    a shaped metric's budget period is a whole number of days and its window step divides a day, so
    every period holds the same windows at the same weights (the loader checks both). The weights are
    read exactly, as the decimal written (`Fraction(repr(w))`, `topology.allocation.hour_weights`).
    The model never holds a flat shape: a flat `schedule:` is stored as None (today's allocation)."""

    hours: tuple[float, ...]
    """24 positive finite weights, hour 0 (00:00–01:00 UTC) first."""
    name: str | None = None
    """The named shape it was written as (`NAMED_SHAPES`), None for hours or a list."""

    def weight_at(self, start: int) -> float:
        """The weight of a window starting at `start` (epoch seconds): its UTC hour of day's."""
        return self.hours[(start % 86_400) // 3_600]


def _hour_ranges(ranges: dict[tuple[int, int], float]) -> tuple[float, ...]:
    weights = [1.0] * HOURS_PER_DAY
    for (lo, hi), weight in ranges.items():
        for hour in range(lo, hi):
            weights[hour] = weight
    return tuple(weights)


NAMED_SHAPES: dict[str, tuple[float, ...]] = {
    "flat": (1.0,) * HOURS_PER_DAY,
    "business_hours": _hour_ranges({(8, 18): 2.0}),
    "evening_peak": _hour_ranges({(18, 23): 2.0}),
}
"""Named schedules: `flat` (every hour 1), `business_hours` (08–18 UTC weigh 2, the rest 1),
`evening_peak` (18–23 UTC weigh 2, the rest 1)."""


@dataclass(frozen=True)
class Budget:
    """A budget scope: (ε, δ) per period, shared by the metrics that draw on it."""

    name: str
    epsilon: float
    delta: float
    accounting: Accounting
    period_s: int
    reserve: float = 0.2
    warn_at: float = 0.8
    on_warning: WarningPolicy = field(default_factory=WarningPolicy)
    schedule: HourlyShape | None = None
    """The default `schedule:` of the scope's metrics (a metric's own wins); None: flat."""


@dataclass(frozen=True)
class Contribution:
    """Per (privacy unit, window) caps applied before aggregation."""

    max_keys: int = 1
    """L0: how many distinct group-by keys one unit may touch per window."""
    max_per_key: int = 1
    """L∞: how many events one unit may add to one key per window."""
    max_windows: int | None = None
    """How many windows of the metric one unit may count in per budget period (None: every window).
    At each window's close, in the public close order, the units present whose count is below it are
    included and counted; the others' contributions to that window are dropped. Only for windows that
    never straddle a period boundary (`Window.straddles`)."""
    max_per_period: int | None = None
    """A running total's per-unit bound over the whole period and across keys, L (events for a count,
    clamped value × events for a sum): at each step's close a unit's contribution is cut to what is
    left of L (`release: running_total` only)."""


@dataclass(frozen=True)
class Bounds:
    """Clamping interval for a numeric value; lower < upper."""

    lower: float
    upper: float

    @property
    def magnitude(self) -> float:
        """Largest |value| after clamping: what one event can add to a sum."""
        return max(abs(self.lower), abs(self.upper))


@dataclass(frozen=True)
class PostProcess:
    """Post-processing applied to noisy values (free of privacy cost, flagged in the record)."""

    round: bool = False
    """Round noisy values to integers."""
    clamp_zero: bool = False
    """Replace negative noisy values by 0."""


@dataclass(frozen=True)
class Source:
    """An input topic and how to read one event from it."""

    name: str
    topic: str
    privacy_unit: str
    timestamp: str | None = None
    """Event-time field (epoch seconds or ISO-8601); None means the Kafka record time."""
    allowed_lateness_s: int = 0
    idle_timeout_s: int = 30
    keyed_by_unit: bool = False
    """True when the topic's Kafka key is the privacy unit, so no repartition hop is needed."""
    max_future_s: int = 3600
    """A live worker dead-letters events timed more than this ahead of its clock (`future_timestamp`):
    one bogus far-future time would otherwise move the watermark past every real event to come."""
    privacy_unit_hash: UnitHash | None = None
    """Replace unit ids by a keyed hash at ingest (None: raw ids, as sent); bounding is unchanged."""
    arrival: Arrival = Arrival.APPEND_TIME
    """Which record time is an event's arrival: the broker's append time, or (weaker) the producer's."""
    partitioner: Partitioner = Partitioner.MURMUR2
    """How the producers of a `keyed_by_unit` source partition by key; a record outside its key's
    partition is dead-lettered (`wrong_partition`). Unused by a repartitioned source."""

    @property
    def create_time_arrival(self) -> bool:
        """Arrival by the producer's record time (weaker): inclusion may depend on the worker's load."""
        return self.arrival is Arrival.CREATE_TIME

    @property
    def event_level(self) -> bool:
        """Event-level DP (weaker): every event is its own privacy unit."""
        return self.privacy_unit == EVENT_LEVEL_UNIT


@dataclass(frozen=True)
class Metric:
    """One released statistic: aggregate, window, bounds, mechanism and its budget weight."""

    name: str
    source: str
    budget: str
    weight: float
    window: Window
    aggregate: Aggregate
    mechanism: Mechanism
    contribution: Contribution = field(default_factory=Contribution)
    value: str | None = None
    bounds: Bounds | None = None
    denominator: float | None = None
    """Public denominator of a mean; None means noisy sum / noisy count."""
    group_by: str | None = None
    keys: tuple[str, ...] | None = None
    """Declared public keys (always released); None with group_by means data-derived keys."""
    k: int | None = None
    may_use_reserve: bool = False
    postprocess: PostProcess = field(default_factory=PostProcess)
    quantiles: tuple[float, ...] | None = None
    """A quantile metric's levels α in (0, 1), ascending (None for every other aggregate)."""
    candidates: tuple[float, ...] | None = None
    """A quantile metric's public candidate grid, ascending, inside `bounds` (from `bins` or listed)."""
    schedule: HourlyShape | None = None
    """How the period's pool is spread over the metric's windows by UTC hour (its own `schedule:`,
    else its budget's); None: flat, every window alike."""
    release: ReleaseKind = ReleaseKind.WINDOW
    """`release: running_total`: each step releases the period's total so far (`ReleaseKind`)."""

    @property
    def running_total(self) -> bool:
        """True for `release: running_total`."""
        return self.release is ReleaseKind.RUNNING_TOTAL

    @property
    def period_bounded(self) -> bool:
        """True when the pipeline keeps per-unit state over the period for this metric (`max_windows`, or
        a running total's `max_per_period`), which a restarted worker must read back."""
        return self.contribution.max_windows is not None or self.contribution.max_per_period is not None

    @property
    def paid_windows(self) -> int | None:
        """How many of the metric's charges a period pays at most (None: all): `contribution.max_windows`,
        or 1 for a running total (its one lump, charged with the period's first step; the top-m rule
        with m = 1 prices it and charges the later steps nothing)."""
        return 1 if self.release is ReleaseKind.RUNNING_TOTAL else self.contribution.max_windows

    @property
    def quantile_labels(self) -> tuple[str, ...]:
        """The released name of each quantile level: 0.5 → 'p50', 0.99 → 'p99', 0.999 → 'p99.9'."""
        return tuple(quantile_label(a) for a in self.quantiles or ())

    def charged_per_period(self, period_s: int) -> int:
        """`charged_windows` of a whole period's releases under this metric's `contribution.max_windows`."""
        return charged_windows(self.window.releases_per_period(period_s), self.paid_windows)

    @property
    def public_keys(self) -> bool:
        """True when the released key set is declared, so it costs nothing and needs no selection."""
        return self.group_by is None or self.keys is not None

    @property
    def needs_partition_selection(self) -> bool:
        """Grouped releases over keys that come from the data (top-k candidates included) pass DP
        partition selection first: a key seen in only one unit's events must not be able to appear."""
        return self.group_by is not None and self.keys is None


@dataclass(frozen=True)
class Sinks:
    """Output topics."""

    releases: str
    dead_letter: str
    partials: str = ""

    @property
    def partials_topic(self) -> str:
        """Internal topic of per-partition window partials (defaults to `<releases>.partials`)."""
        return self.partials or f"{self.releases}.partials"


@dataclass(frozen=True)
class KafkaSettings:
    """Where the Kafka cluster is and how its clients authenticate. The password is never in the file:
    it comes from DPSTREAM_KAFKA_SASL_PASSWORD (or _FILE); each DPSTREAM_KAFKA_* variable set wins."""

    bootstrap: str = "localhost:9092"
    security_protocol: KafkaProtocol | None = None
    """TLS and SASL of every client (unset: SASL_SSL with a SASL user, SSL with a CA file, else PLAINTEXT)."""
    sasl_mechanism: str | None = None
    """SCRAM-SHA-512 (the default), SCRAM-SHA-256 or PLAIN."""
    sasl_username: str | None = None
    """The worker's SASL user."""
    ssl_cafile: str | None = None
    """PEM file of the CA that signed the brokers' certificates (unset: the system's CAs)."""


@dataclass(frozen=True)
class RedisSettings:
    """Where the ledger's Redis is."""

    url: str = "redis://localhost:6379/0"


@dataclass(frozen=True)
class Topology:
    """A whole declared pipeline, as loaded from one file."""

    version: int
    sources: dict[str, Source]
    budgets: dict[str, Budget]
    metrics: dict[str, Metric]
    sinks: Sinks
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    redis: RedisSettings = field(default_factory=RedisSettings)
    path: str = ""
    schedule_start: int | None = None
    """The deployment's public start S (UTC epoch seconds, `start:` in the file): the public release
    schedule starts at S. Omitted: the first start of this topology version, recorded once in the ledger."""
    publish_delay_s: int = DEFAULT_PUBLISH_DELAY_S
    """Seconds after a window's close time C(w) = end + allowed_lateness at which its release is
    published (`publish_delay`): the public time P(w) = C(w) + publish_delay. A release is never
    published before P(w) and is stamped with it; one that misses it is late (release lag). Processing
    time grows with the data, so the default is a margin a healthy worker meets."""

    def publish_time(self, metric: Metric, window_end: int) -> int:
        """P(w) in epoch seconds: the public time the release of `metric`'s window ending at
        `window_end` is published at (its close time C(w) plus `publish_delay`). It depends on the
        topology and the window only, never on the data or on how long processing took."""
        return int(window_end) + self.sources[metric.source].allowed_lateness_s + self.publish_delay_s

    def metrics_of(self, budget: str) -> list[Metric]:
        """The metrics charged to one budget scope, in file order."""
        return [m for m in self.metrics.values() if m.budget == budget]

    @property
    def topology_version(self) -> str:
        """Hash of the normalised privacy-relevant content: same file → same release_ids.

        Connection settings (kafka, redis) and the file path are left out, so moving a
        deployment does not re-release (and re-charge) windows. `start_s` is in only when
        set, so a topology without `start:` keeps the version it had before the field existed.
        `publish_delay_s` is left out too: it moves when releases appear, not what they hold or
        cost, so raising it on a running deployment keeps every release_id and its charge.
        """
        doc: dict[str, object] = {
            "version": self.version,
            "sources": {k: _source_doc(v) for k, v in sorted(self.sources.items())},
            "budgets": {k: _budget_doc(v) for k, v in sorted(self.budgets.items())},
            "metrics": {k: _metric_doc(v) for k, v in sorted(self.metrics.items())},
            "sinks": asdict(self.sinks),
        }
        if self.schedule_start is not None:
            doc["start_s"] = self.schedule_start
        blob = json.dumps(doc, sort_keys=True, default=_enum_value, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def charged_windows(windows: int, max_windows: int | None) -> int:
    """Of `windows` releases of a metric in one period, how many one unit's contributions can reach:
    at most `max_windows` (None: no cap). The pricing rule takes this as the metric's count of windows
    (per period, and left), so under a cap each release is priced at the metric's period share over
    max_windows: a unit's worst-case spend in a period is the sum of its max_windows largest charges."""
    return windows if max_windows is None else min(windows, max_windows)


def quantile_label(alpha: float) -> str:
    """'p' and the level in percent without trailing zeros: 0.5 → 'p50', 0.999 → 'p99.9'."""
    return "p" + f"{alpha * 100:.10f}".rstrip("0").rstrip(".")


_QUANTILE_FIELDS = ("quantiles", "candidates", "schedule")
_DEFAULT_FIELDS = {"release": ReleaseKind.WINDOW.value}
"""Metric fields added later with a default: hashed only when not the default."""
"""Metric fields added later (quantiles, schedule): hashed only when set, so older versions stay as they were."""


def _budget_doc(budget: Budget) -> dict[str, object]:
    """A budget as hashed: `schedule` only when set (a flat scope keeps its version)."""
    doc = asdict(budget)
    if budget.schedule is None:
        del doc["schedule"]
    return doc


def _metric_doc(metric: Metric) -> dict[str, object]:
    """A metric as hashed: the quantile fields and `contribution.max_windows` only when set (a metric
    without them keeps the version it had before they existed)."""
    doc = asdict(metric)
    for name in _QUANTILE_FIELDS:
        if doc[name] is None:
            del doc[name]
    for name, default in _DEFAULT_FIELDS.items():
        if _enum_value(doc[name]) == default:
            del doc[name]
    contribution = doc["contribution"]
    assert isinstance(contribution, dict)
    for name in ("max_windows", "max_per_period"):
        if contribution[name] is None:
            del contribution[name]
    return doc


def _source_doc(source: Source) -> dict[str, object]:
    """A source as hashed: `arrival` only when not the default, so existing versions stay as they were."""
    doc = asdict(source)
    if source.arrival is Arrival.APPEND_TIME:
        del doc["arrival"]
    if source.partitioner is Partitioner.MURMUR2:  # the default: versions from before the field stay
        del doc["partitioner"]
    return doc


def _enum_value(obj: object) -> object:
    if isinstance(obj, Enum):
        return obj.value
    raise TypeError(f"cannot normalise {type(obj).__name__}")
