"""Shared pieces of the neighbour tests (DESIGN §1 "Stream semantics"): the topology, an ordinary
stream D, the adversary's events, a replay runner and the D-vs-D′ comparison.

The comparison is the whole point: D′ = D plus every event of one unit. Rule 2 (public schedule)
says the set of release_ids is the same; the bounding rules say each released value moves by at
most the metric's declared sensitivity, plus the two sides' independent noise, which we bound by a
sub-Gaussian tail (see `noise_k`).

The data-independent series (workers/telemetry/classes.py) are compared too, sample by sample and
exactly: what the budget collector serves from each side's ledger at injected instants
(`replay_series`, `ledger_series`) and what a live worker without `--curator-metrics` serves on
/metrics (`aligned_scrapes`). Nothing but `PER_DEPLOYMENT` is left out, each entry with its reason.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import math
import random
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Aggregate, Metric, Topology
from dpstream.topology.sensitivity import release_sensitivities
from dpstream.workers.commands.replay import replay_lines
from dpstream.workers.ledger import open_ledger
from dpstream.workers.telemetry.budget import BudgetCollector, BudgetReader, LedgerSource
from dpstream.workers.telemetry.info import TopologyInfo
from dpstream.workers.telemetry.web import Telemetry

# Huge budget so noise is small next to the sensitivities we check. The ledger keeps a scope's cap
# in exact 1e-12 units below 9007, so epsilon 1e6 is refused; epsilon 8000 at delta 1e-6 gives
# rho* ≈ 7364. The period is 1h (not 1d) so each period's cap is spread over 24x fewer releases:
# count noise sigma ≈ 0.4 instead of ≈ 2.3, which lets a doubled sensitivity show.
# active_5m comes last on purpose: replay releases metric by metric, and its windows that straddle
# an hour boundary are priced as if the hour's other releases were done; listed earlier, they take
# the rest of the hour's pool and the hour's later `spend` / `referrers` windows are refused.
# test_the_whole_schedule_is_published_and_the_bounds_are_the_declared_ones checks nothing is refused.
TOPOLOGY_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts, allowed_lateness: 5s}
budgets:
  huge: {epsilon: 8000.0, delta: 1.0e-6, accounting: zcdp, period: 1h}
metrics:
  views:
    source: clicks
    budget: huge
    window: {tumbling: 1m}
    aggregate: count
    contribution: {max_per_key: 5}
    mechanism: gaussian
  pages:
    source: clicks
    budget: huge
    window: {tumbling: 5m}
    aggregate: count
    group_by: page
    keys: [home, search, cart, "42"]
    contribution: {max_keys: 2, max_per_key: 3}
    mechanism: gaussian
  spend:
    source: clicks
    budget: huge
    window: {tumbling: 10m}
    aggregate: sum
    value: amount
    bounds: [-5, 20]
    contribution: {max_per_key: 2}
    mechanism: gaussian
  referrers:
    source: clicks
    budget: huge
    window: {tumbling: 30m}
    aggregate: count
    group_by: ref
    contribution: {max_keys: 1, max_per_key: 1}
    mechanism: gaussian
  active_5m:
    source: clicks
    budget: huge
    window: {hopping: 5m, every: 1m}
    aggregate: count_units
    group_by: page
    keys: [home, search, cart, "42"]
    contribution: {max_keys: 2}
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""One scrape's samples: (sample name, sorted labels) → value."""

DECLARED_PAGES = ("home", "search", "cart", "42")
T0 = 1_796_000_400 - 1_796_000_400 % 3600  # 2026-11-30T01:00Z, hour-aligned
HOUR = 3600

_TOPOLOGY: Topology | None = None


def topology() -> Topology:
    global _TOPOLOGY
    if _TOPOLOGY is None:
        _TOPOLOGY = load_topology_text(TOPOLOGY_YAML)
    return _TOPOLOGY


# -- declared sensitivities (from the contribution bounds only) --------------------------------
@dataclass(frozen=True)
class Bound:
    """How far one unit may move one release of a metric: per key (L∞), over keys (L1), keys (L0)."""

    linf: float
    l1: float
    l0: int


def declared_bound(metric: Metric) -> Bound:
    """count: max_per_key per key; count_units: 1 per key; sum: max_per_key × max(|lo|, |hi|) per
    key; over keys, times max_keys (1 for an ungrouped metric)."""
    c = metric.contribution
    keys = c.max_keys if metric.group_by is not None else 1
    if metric.aggregate is Aggregate.COUNT:
        per_key = float(c.max_per_key)
    elif metric.aggregate is Aggregate.COUNT_UNITS:
        per_key = 1.0
    elif metric.aggregate is Aggregate.SUM:
        assert metric.bounds is not None
        per_key = c.max_per_key * max(abs(metric.bounds.lower), abs(metric.bounds.upper))
    else:  # pragma: no cover - the topology has no other aggregate to compare
        raise AssertionError(f"no bound for {metric.aggregate}")
    return Bound(per_key, per_key * keys, keys)


def topology_sensitivity(metric: Metric) -> tuple[float, float]:
    """(L∞, L1) of the metric's single noisy component as `topology.sensitivity` computes them."""
    (sens,) = release_sensitivities(metric)
    return sens.linf, sens.l1


def compared_metrics(topo: Topology) -> list[Metric]:
    """Metrics whose values we compare: ungrouped or with declared keys. A data-derived group-by
    (`referrers`) releases only the keys that pass partition selection, a random draw near its
    threshold on either side, so a key may appear in one release and not the other for reasons
    that have nothing to do with the adversary; for it we check only the schedule (release_ids)."""
    return [m for m in topo.metrics.values() if m.group_by is None or m.keys is not None]


def schedule_size(topo: Topology, start: int, end: int) -> tuple[int, int]:
    """(releases, compared values) in [start, end): every window with start ≥ S and end ≤ end."""
    releases = values = 0
    for m in topo.metrics.values():
        size, every = m.window.size_s, m.window.every_s
        first = -(-start // every) * every
        n = max(0, (end - size - first) // every + 1)
        releases += n
        if m in compared_metrics(topo):
            values += n * (len(m.keys) if m.keys is not None else 1)
    return releases, values


# -- noise margin ---------------------------------------------------------------------------------
def noise_k(comparisons: int, false_failure: float = 1e-6) -> float:
    """k such that `comparisons` two-sided tests |X| ≤ k·s all pass with probability ≥ 1 − false_failure.

    Each compared value is truth + noise with independent noise on the D and D′ sides. The discrete
    Gaussian with scale σ is σ-sub-Gaussian (Canonne–Kamath–Steinke 2020, "The Discrete Gaussian for
    Differential Privacy"), and so is the fixed-point sum's noise (the grid step times a discrete
    Gaussian of scale σ / step); the difference of the two sides' noises is then
    s-sub-Gaussian with s = √(σ₁² + σ₂²) (= σ√2 for equal scales), so P(|X| > k·s) ≤ 2·exp(−k²/2)
    (the Chernoff bound; the continuous Gaussian tail 2(1 − Φ(k)) is smaller still). A union bound
    over every comparison gives 2·exp(−k²/2)·comparisons ≤ false_failure, i.e.
    k = √(2·ln(2·comparisons / false_failure)).
    """
    return math.sqrt(2.0 * math.log(2.0 * comparisons / false_failure))


def sigma_of(record: dict[str, Any]) -> float:
    """The sub-Gaussian parameter of one released value: the mechanism's `noise.scale` (for a discrete
    Gaussian the actual `noise.stddev` is ≤ scale, and equal to it once scale ≳ 1)."""
    noise = record["noise"]
    return max(float(noise["scale"]), float(noise["stddev"]))


# -- streams --------------------------------------------------------------------------------------
HEAVY = "7"
"""A heavy unit of D (hits its per-window bounds): the adversary may write its id as the integer 7."""


def ordinary_stream(seed: int, start: int, end: int, *, units: int = 50, events: int = 300) -> list[dict]:
    """A plain stream: `events` events of `units` units (ids "0".."49", strings), times uniform in
    [start, end), in time order, declared pages and a few referrers, amounts inside the bounds; unit
    "7" is a heavy user: 6 bursts of 12 events 5 s apart (over every per-window cap of views, pages
    and spend). Synthetic data, so a seeded non-cryptographic RNG; the noise is never seeded."""
    rng = random.Random(seed)
    out = []
    for _ in range(events):
        out.append(
            {
                "user_id": str(rng.randrange(units)),
                "ts": round(rng.uniform(start, end - 1), 3),
                "page": rng.choice(DECLARED_PAGES[:3]),
                "ref": rng.choice(("google", "news", "mail")),
                "amount": rng.randint(0, 15),
            }
        )
    for _ in range(6):  # the heavy unit
        t = rng.uniform(start, end - 300)
        for j in range(12):
            out.append(
                {
                    "user_id": HEAVY,
                    "ts": round(t + 5 * j, 3),
                    "page": DECLARED_PAGES[j % 3],
                    "ref": "google",
                    "amount": 18,
                }
            )
    out.sort(key=lambda e: e["ts"])
    return out


def without_unit(events: Sequence[dict], unit: str) -> list[dict]:
    return [e for e in events if str(e.get("user_id")) != unit]


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def to_lines(events: Iterable[Any]) -> list[bytes]:
    """JSON lines; an item that is already bytes is a raw (possibly malformed) line."""
    return [e if isinstance(e, bytes) else json.dumps(e).encode() for e in events]


def interleave(base: Sequence[Any], extra: Sequence[tuple[int, Any]]) -> list[Any]:
    """`base` with each (position, item) of `extra` inserted before base[position] (stable)."""
    at: dict[int, list[Any]] = {}
    for pos, item in extra:
        at.setdefault(min(max(pos, 0), len(base)), []).append(item)
    out: list[Any] = []
    for i in range(len(base) + 1):
        out.extend(at.get(i, ()))
        if i < len(base):
            out.append(base[i])
    return out


# -- running ----------------------------------------------------------------------------------------
class Clock:
    """A settable clock (epoch s) for a ledger and the budget collector reading it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def after_every_publish_time(topo: Topology, end: int) -> float:
    """An instant after the public time P(w) of every window ending by `end`: one second past the largest."""
    return max(topo.publish_time(m, end) for m in topo.metrics.values()) + 1.0


def scrape_instants(topo: Topology, start: int, end: int) -> list[float]:
    """Where the replay tests read the budget series: half-way through each budget period of the
    range (charges of that period whose P(w) is still to come are left out there), and after every P(w)."""
    periods = sorted({b.period_s for b in topo.budgets.values()})
    mids = [t + p / 2 + 0.5 for p in periods for t in range(start - start % p, end, p) if start <= t + p / 2 < end]
    return [*mids, after_every_publish_time(topo, end)]


def _replay(
    topo: Topology, lines: Sequence[bytes], start: int, end: int, partitions: int, scrape_at: Sequence[float] = ()
) -> tuple[dict[str, bytes], list[Series]]:
    """Replay `lines` over [start, end) on a fresh memory ledger whose clock stands after every P(w):
    (release_id → the bytes published, the budget series served at each instant of `scrape_at`)."""

    async def go() -> tuple[dict[str, bytes], list[Series]]:
        clock = Clock(after_every_publish_time(topo, end))
        ledger = await open_ledger("memory", topo, clock=clock)
        published: dict[str, bytes] = {}

        async def publish(value: bytes, key: bytes) -> None:
            assert key.decode() not in published, "a release_id was published twice"
            published[key.decode()] = value

        await replay_lines(topo, lines, ledger, publish, start=start, end=end, partitions=partitions)
        scrapes = []
        for at in scrape_at:
            clock.now = at
            scrapes.append(await _served(topo, LedgerSource("memory", shared=lambda: ledger), clock))
        return published, scrapes

    return asyncio.run(go())


def run_replay(topo: Topology, lines: Sequence[bytes], start: int, end: int, partitions: int) -> dict[str, dict]:
    """Replay `lines` over the public schedule [start, end) on a fresh memory ledger; release_id → record."""
    raw, _ = _replay(topo, lines, start, end, partitions)
    return {rid: json.loads(value) for rid, value in raw.items()}


def replay_series(
    topo: Topology, lines: Sequence[bytes], start: int, end: int, partitions: int
) -> tuple[dict[str, dict], list[Series]]:
    """`run_replay`, and what the budget collector serves from its ledger at each `scrape_instants`."""
    raw, scrapes = _replay(topo, lines, start, end, partitions, scrape_instants(topo, start, end))
    return {rid: json.loads(value) for rid, value in raw.items()}, scrapes


def run_replay_cli(topology_file: str, lines: Sequence[bytes], flags: Sequence[str], tmp: Any) -> tuple[int, dict]:
    """`dpstream replay TOPOLOGY EVENTS FLAGS` as a user runs it (its own in-process ledger), with
    `lines` as the events file in directory `tmp`: (exit code, release_id → record)."""
    from dpstream.workers.cli import main

    events, out = tmp / "events.jsonl", tmp / "releases.jsonl"
    events.write_bytes(b"".join(line + b"\n" for line in lines))
    out.unlink(missing_ok=True)
    code = main(["replay", str(topology_file), str(events), "--out", str(out), *flags])
    records = [json.loads(line) for line in out.read_bytes().splitlines()] if out.exists() else []
    return code, {r["release_id"]: r for r in records}


def run_replay_raw(
    topo: Topology, lines: Sequence[bytes], start: int, end: int, partitions: int
) -> tuple[dict[str, bytes], list[Series]]:
    """`replay_series`, keeping each record's bytes exactly as published: (release_id → bytes, series)."""
    return _replay(topo, lines, start, end, partitions, scrape_instants(topo, start, end))


def public_fields(raw: bytes) -> dict[str, Any]:
    """Everything a release record publishes except its noisy `values`: what must not differ at all
    between D and D′ (the schedule, costs, ratio_after, noise scales, `published_at`)."""
    return _without_values(json.loads(raw))


def _without_values(record: dict[str, Any]) -> dict[str, Any]:
    """`record` without its noisy `values` (the keys of a noise-selected set are compared apart)."""
    return {name: field for name, field in record.items() if name != "values"}


def field_differences(base: dict[str, dict], neighbour: dict[str, dict]) -> list[str]:
    """Every release of both sides whose record differs outside its noisy values (costs,
    ratio_after, noise scale, CI, published_at, ...), as readable lines naming the fields."""
    problems = []
    for rid in sorted(set(base) & set(neighbour)):
        a, b = _without_values(base[rid]), _without_values(neighbour[rid])
        if a != b:
            fields = sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))
            problems.append(
                f"{_where(base[rid])}: fields {fields} differ: D {[a.get(f) for f in fields]}, "
                f"D′ {[b.get(f) for f in fields]}"
            )
    return problems


# -- comparing ------------------------------------------------------------------------------------
def compare(
    topo: Topology,
    base: dict[str, dict],
    neighbour: dict[str, dict],
    k: float,
    unit_times: Sequence[float] | None = None,
) -> list[str]:
    """Everything in `neighbour` (D′) that a neighbour of `base` (D) may not show, as readable lines:
    a release on one side only, a record differing outside its noisy values, or a value moved past
    the declared bound.

    Per release of a compared metric and per key, with margin m = k·√(σ_D² + σ_D′²):
    |v′ − v| ≤ L∞ + m. Under the same noise event (|noise difference| ≤ m on every key) the true
    change of a key is at least |v′ − v| − m, so Σ_keys max(0, |v′ − v| − m) ≤ L1 and at most L0
    keys have |v′ − v| > m: the L1 / L0 checks cost no extra union-bound terms.

    `unit_times`: every event time the differing unit wrote. By rule 1 an event counts only in the
    windows its own time lies in, so a window holding none of them has the same true value in D and
    D′: its bound is 0 (noise only). That is what catches one unit's timestamp moving others' events.
    """
    times = sorted(unit_times) if unit_times is not None else None
    problems: list[str] = []
    every = {**base, **neighbour}

    def in_order(rids: set[str]) -> list[str]:
        return sorted(rids, key=lambda r: (every[r]["metric"], every[r]["window"]["start_epoch"]))

    only_base = in_order(set(base) - set(neighbour))
    only_nb = in_order(set(neighbour) - set(base))
    for rid in only_base[:5]:
        problems.append(f"release only in D: {_where(base[rid])}")
    for rid in only_nb[:5]:
        problems.append(f"release only in D′: {_where(neighbour[rid])}")
    if len(only_base) > 5 or len(only_nb) > 5:
        problems.append(
            f"... {len(only_base)} releases only in D, {len(only_nb)} only in D′ "
            f"(D has {len(base)}, D′ {len(neighbour)})"
        )
    problems += field_differences(base, neighbour)
    compared = {m.name: m for m in compared_metrics(topo)}
    for rid in in_order(set(base) & set(neighbour)):
        a, b = base[rid], neighbour[rid]
        metric = compared.get(a["metric"])
        if metric is None:
            continue
        bound = declared_bound(metric)
        note = ""
        if times is not None and not _holds_any(times, a["window"]["start_epoch"], a["window"]["end_epoch"]):
            bound, note = Bound(0.0, 0.0, 0), " (no event of the unit in this window)"
        if set(a["values"]) != set(b["values"]):
            problems.append(f"{_where(a)}: keys {sorted(a['values'])} in D, {sorted(b['values'])} in D′")
            continue
        m = k * math.hypot(sigma_of(a), sigma_of(b))
        excess_total, moved = 0.0, []
        for key in sorted(a["values"]):
            diff = float(b["values"][key]) - float(a["values"][key])
            if abs(diff) > bound.linf + m:
                problems.append(
                    f"{_where(a)} key {key!r}: D {a['values'][key]} → D′ {b['values'][key]}, "
                    f"|Δ| = {abs(diff):.3f} > L∞ {bound.linf} + noise margin {m:.3f}{note}"
                )
            if abs(diff) > m:
                excess_total += abs(diff) - m
                moved.append(key)
        if excess_total > bound.l1 + 1e-9:
            problems.append(f"{_where(a)}: Σ_keys (|Δ| − margin)+ = {excess_total:.3f} > L1 {bound.l1}{note}")
        if len(moved) > bound.l0:
            problems.append(
                f"{_where(a)}: {len(moved)} keys moved beyond the noise margin > L0 {bound.l0}{note}: {moved}"
            )
    return problems


def _holds_any(times: Sequence[float], start: float, end: float, slack: float = 0.01) -> bool:
    """Whether some time lies in [start, end), with `slack` either side (time formats round)."""
    i = bisect.bisect_left(times, start - slack)
    return i < len(times) and times[i] < end + slack


def _where(rec: dict) -> str:
    return f"{rec['metric']} window {rec['window']['start']}"


# -- the data-independent series -------------------------------------------------------------------
PER_DEPLOYMENT: Mapping[tuple[str, str], str] = {
    ("dpstream_build_info", "topology_version"): (
        "the hash of the topology file: two live deployments differ in their topic names (and a second "
        "ledger), fixed before any event is read; the rest of the series (version, value) is compared"
    ),
}
"""(sample name, label) left out of every comparison, with why it is data-free. Nothing else is: no
process start time or similar series is served (each process has its own registry, without the
default process collectors)."""


def parse_series(text: str) -> Series:
    """The samples of one exposition (`PER_DEPLOYMENT` labels dropped)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if (sample.name, k) not in PER_DEPLOYMENT))
            key = (sample.name, labels)
            assert key not in out, f"sample {key} served twice"
            out[key] = sample.value
    return out


def compare_series(base: Series, neighbour: Series, where: str = "") -> list[str]:
    """Every sample that differs between D and D′ (present on one side only, or another value), as lines."""
    problems = []
    for key in sorted(set(base) | set(neighbour)):
        name = key[0] + "{" + ",".join(f"{k}={v!r}" for k, v in key[1]) + "}"
        if key not in neighbour:
            problems.append(f"{where}{name} only in D ({base[key]!r})")
        elif key not in base:
            problems.append(f"{where}{name} only in D′ ({neighbour[key]!r})")
        elif not (
            # equal up to float rounding (a projection divides times: its last ulp may differ)
            math.isclose(base[key], neighbour[key], rel_tol=1e-12, abs_tol=0.0)
            or (math.isnan(base[key]) and math.isnan(neighbour[key]))
        ):
            problems.append(f"{where}{name}: D {base[key]!r}, D′ {neighbour[key]!r}")
    return problems


def spent_somewhere(series: Series) -> bool:
    """Whether the scrape shows some spend (so a comparison of it is not one of empty ledgers)."""
    return any(name == "dpstream_budget_spent_total" and v > 0 for (name, _labels), v in series.items())


async def _served(topo: Topology, source: LedgerSource, clock: Clock) -> Series:
    """What `dpstream exporter` serves for `topo` from `source` at `clock` (budget gauges of published
    charges, ledger_up, the topology's info gauges): the same collectors and class filter."""
    budget = BudgetCollector(source, BudgetReader(topo, clock=clock))
    telemetry = Telemetry("neighbours", budget, [TopologyInfo(topo)], curator=False)
    try:
        return parse_series((await telemetry.render()).decode())
    finally:
        await telemetry.close()


class _ClockedSource(LedgerSource):
    """A read-only Redis ledger whose clock is `clock` (its status and projection at that instant)."""

    def __init__(self, where: str, clock: Clock) -> None:
        super().__init__(where)
        self._at = clock

    async def get(self) -> Any:
        if self._ledger is None:
            self._ledger = await open_ledger(self.where, None, actor="telemetry", clock=self._at, max_connections=4)
        return self._ledger


def ledger_series(topo: Topology, redis_url: str, at: float) -> Series:
    """What the exporter serves from the Redis ledger at `redis_url` at instant `at` (injected: the
    ledger's clock and the collector's), after the workers writing to it have stopped."""
    return asyncio.run(_served(topo, _ClockedSource(redis_url, Clock(at)), Clock(at)))


# -- live workers ----------------------------------------------------------------------------------
def start_worker_web(dep: Any, name: str) -> int:
    """Start `dpstream worker` (no `--curator-metrics`) for Deployment `dep` with a web port, as its
    `start_worker` does; the port once /health answers. It is stopped with the others (`stop_all`)."""
    import subprocess

    from dpstream.workers.localstack import free_port

    port = free_port()
    log = open(dep.path.parent / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
    argv = [sys.executable, "-m", "dpstream.workers.cli", "worker", str(dep.path), "--bootstrap", dep.bootstrap]
    argv += ["--redis", dep.redis_url, "--worker-id", name, "--web-port", str(port)]
    dep.workers.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 90
    while _get(port) is None:
        assert dep.workers[-1].poll() is None and time.monotonic() < deadline, dep.log(name)[-2000:]
        time.sleep(0.3)
    return port


def _get(port: int, path: str = "/health") -> bytes | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=15) as resp:
            return resp.read() if resp.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None


def scrape(port: int) -> Series:
    body = _get(port, "/metrics")
    assert body is not None, f"no /metrics on port {port}"
    return parse_series(body.decode())


def aligned_scrapes(port_a: int, port_b: int, attempts: int = 10) -> tuple[Series, Series]:
    """One /metrics scrape of each worker, both between the same two ticks of the clock.

    Every data-independent series of a live worker moves only at whole seconds (each P(w) and each
    window end is one; the ledger read counts a charge from its P(w) on, a release is published just
    after it), except `dpstream_budget_projected_ratio`, which scales with the time since the period
    start and is dropped here (`ledger_series` compares it at one injected instant). So the scrapes
    start half-way between two seconds, and are taken as A, B, A, B: when each side's two scrapes
    agree, none of its series moved in between and the pair shows both at one clock tick."""
    for _ in range(attempts):
        time.sleep((0.5 - time.time() % 1.0) % 1.0)
        a1, b1, a2, b2 = (_timeless(scrape(p)) for p in (port_a, port_b, port_a, port_b))
        if a1 == a2 and b1 == b2:
            return a1, b1
    raise AssertionError(f"no two consecutive scrapes of a worker agreed in {attempts} attempts")


def _timeless(series: Series) -> Series:
    return {key: v for key, v in series.items() if key[0] != "dpstream_budget_projected_ratio"}
