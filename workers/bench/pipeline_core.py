"""Micro-benchmark of the Kafka-free hot path: `PartitionPipeline.process_batch` events/s.

    python -m dpstream.workers.bench.pipeline_core [--events 1000000] [--topology web-analytics.yaml]
        [--batch 20000] [--close-at-end] [--json]

Synthetic, pre-encoded events (a bench module, so numpy's RNG is fine here) at 10 events per
event-second, half of them from a few heavy units that hit the caps, each record stamped with its
event time as its append time, fetched 20,000 records at a time (an ingest-only worker's fetch);
the JSON decode loop over the same bytes is timed alongside as the in-run baseline. After each
fetch the pipeline is told the partition's end was reached at the last record's time (`mark_end`),
as the ingest driver does, so windows close as the stream goes. `--close-at-end` instead keeps every
window open until the final flush (the figure before the bench closed as it goes: its state grows
with the whole run, which no live worker holds).
"""

from __future__ import annotations

__all__ = ["register", "run", "main"]

import argparse
import json
import sys
import time
from importlib import resources
from typing import NamedTuple

import numpy as np

from dpstream.topology.loader import load_topology
from dpstream.workers.pipeline import PartitionPipeline
from dpstream.workers.pipeline.events import decode_json
from dpstream.workers.runtime.settings import RuntimeSettings

_T0 = 1_790_000_000
"""The first event second, and the schedule's start S."""


class _Rec(NamedTuple):
    offset: int
    value: bytes
    timestamp: int


_APPEND_LAG_MS = 50
"""How long after its event time a record is appended (a producer on time)."""


def _events(n: int, seed: int = 7) -> list[bytes]:
    rng = np.random.default_rng(seed)
    heavy = rng.integers(0, 50, n)
    light = rng.integers(0, 200_000, n)
    use_heavy = rng.random(n) < 0.5
    pages = ("home", "search", "product", "cart", "checkout")
    page = rng.integers(0, 5, n)
    ref = rng.integers(0, 40, n)
    eur = rng.uniform(-20, 240, n).round(2)
    sess = rng.uniform(0, 4000, n).round(1)
    out = []
    for i in range(n):
        unit = f"h{heavy[i]}" if use_heavy[i] else f"u{light[i]}"
        out.append(
            json.dumps(
                {
                    "user_id": unit,
                    "ts": _T0 + i // 10,
                    "page": pages[page[i]],
                    "referrer": f"r{ref[i]}.example",
                    "basket_eur": float(eur[i]),
                    "session_s": float(sess[i]),
                },
                separators=(",", ":"),
            ).encode()
        )
    return out


def run(
    events: int,
    topology_path: str | None = None,
    batch: int = RuntimeSettings.batch_max_records,
    close_at_end: bool = False,
) -> dict[str, float]:
    """Time process_batch (and the closes it reaches) over `events` synthetic events (one partition)
    and a bare decode loop; `batch` records a fetch, by default as many as an ingest-only worker fetches."""
    path = topology_path or str(resources.files("dpstream.topology") / "examples" / "web-analytics.yaml")
    topo = load_topology(path)
    raw = _events(events)
    recs = [_Rec(i, v, (_T0 + i // 10) * 1000 + _APPEND_LAG_MS) for i, v in enumerate(raw)]
    t = time.perf_counter()
    for v in raw:
        decode_json(v)
    decode_s = time.perf_counter() - t
    pipe = PartitionPipeline(topo, next(iter(topo.sources)), 0, schedule_start=_T0)
    partials = 0
    t = time.perf_counter()
    cpu = time.process_time()
    for i in range(0, len(recs), batch):
        fetched = recs[i : i + batch]
        partials += len(pipe.process_batch(fetched).partials)
        if not close_at_end:
            last = fetched[-1]
            partials += len(pipe.mark_end(last.timestamp / 1000, last.offset + 1).partials)
    flush = time.perf_counter()
    partials += len(pipe.flush().partials)
    core_s = time.perf_counter() - t
    flush_s = time.perf_counter() - flush
    cpu_s = time.process_time() - cpu
    counts = pipe.refresh_counts().snapshot()
    return {
        "events": events,
        "core_events_per_s": events / core_s,
        "decode_only_events_per_s": events / decode_s,
        "core_vs_decode_ratio": decode_s / core_s,
        "cpu_s_per_million": cpu_s / events * 1e6,
        "us_per_event": core_s / events * 1e6,
        "flush_us_per_event": flush_s / events * 1e6,
        "partials": partials,
        "closed_as_it_goes": not close_at_end,
        "capped": counts["capped"],
    }


def _print(result: dict[str, float], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, sort_keys=True))
        return
    print(f"events                {result['events']:>12,}")
    print(
        f"core process_batch    {result['core_events_per_s']:>12,.0f} events/s ({result['us_per_event']:.2f} µs/event)"
    )
    closes = "the windows still open at the end" if result["closed_as_it_goes"] else "every window, all held to the end"
    print(f"  of which the flush  {result['flush_us_per_event']:>12.2f} µs/event (closing {closes})")
    print(
        f"JSON decode only      {result['decode_only_events_per_s']:>12,.0f} events/s "
        f"({1e6 / result['decode_only_events_per_s']:.2f} µs/event)"
    )
    print(f"core / decode ratio   {result['core_vs_decode_ratio']:>12.2f}")
    print(f"CPU s per 1M events   {result['cpu_s_per_million']:>12.2f}")
    print(f"partials emitted      {result['partials']:>12,}   capped contributions {result['capped']:,}")


def _command(a: argparse.Namespace) -> int:
    _print(run(a.events, a.topology, a.batch, a.close_at_end), a.json)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `pipeline-core` (only reachable if the bench dispatcher lists it)."""
    p = subparsers.add_parser("pipeline-core", help="events/s of the Kafka-free core")
    _arguments(p)
    p.set_defaults(func=_command)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--topology", default=None)
    p.add_argument(
        "--batch", type=int, default=RuntimeSettings.batch_max_records, help="records a fetch (default: the ingest's)"
    )
    p.add_argument("--close-at-end", action="store_true", help="hold every window open until the final flush")
    p.add_argument("--json", action="store_true")


def main(argv: list[str] | None = None) -> int:
    """`python -m dpstream.workers.bench.pipeline_core`."""
    p = argparse.ArgumentParser(prog="python -m dpstream.workers.bench.pipeline_core")
    _arguments(p)
    a = p.parse_args(argv)
    _print(run(a.events, a.topology, a.batch, a.close_at_end), a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
