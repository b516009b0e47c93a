"""Chaos: a pair of workers under live load while workers, Redis and Kafka fail; `dpstream verify` then finds nothing.

CI-sized by default (one ~64 s round of injections); `DPSTREAM_CHAOS_LONG=<minutes>` runs rounds of
150 s for that long. Each round: a worker SIGKILLed at a random time (twice), the crash hook killing a
worker between charge and publish and between publish and commit, Redis SIGKILLed and restarted on its
AOF, Redis stopped (6 s; 30 s in the long run), and the Kafka broker restarted. A clean deployment (one
undisturbed worker, its own Redis) reads the same source topic. Afterwards `dpstream verify` (the CLI,
a subprocess) checks the chaos deployment with the Redis outages and `--compare-to` the clean run's
releases (ε large, so values nearly exact) and must exit 0. The figures (injections, windows,
violations, release lag during the injections) are printed and written to figures.json
(and to $DPSTREAM_CHAOS_FIGURES if set).

The second test runs the ledger as a primary and a replica under Redis Sentinel: each round SIGKILLs
the primary and lets Sentinel promote the replica (the old primary comes back as its replica), with the
same worker kills (CI: one 48 s round; the broker restart only in the long run).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dpstream.workers.verify import VerifyOptions, verify_deployment
from dpstream.workers.verify.sources import read_topic
from tests.chaos.harness import (
    WINDOW_S,
    ChaosSettings,
    Injection,
    Producer,
    ReleaseWatcher,
    Servers,
    Slot,
    Supervisor,
    percentile,
    release_lags,
    write_topology,
)
from tests.e2e._monitoring import choose_period

EPSILON = 1000.0
PERIODS = ("1d", "2d", "3d", "5d", "7d")
RUN_MARGIN_S = 1800
"""What a run needs beyond its feed (servers, the first release, the drain and verify), with room to spare."""


def _verify_ok(topology: Any, bootstrap: str, redis_url: str, until: float, outages: list[tuple[float, float]]) -> Any:
    """In-process verify (no --compare-to): the report, or None if it could not read the deployment yet."""
    options = VerifyOptions(bootstrap, redis_url, grace_s=0.0, until_s=until, outages=tuple(outages))
    try:
        return asyncio.run(verify_deployment(topology, options))
    except Exception:  # a server still recovering: try again later
        return None


def _ready(bootstrap: str, topic: str) -> bool:
    try:
        return bool(asyncio.run(read_topic(bootstrap, topic, timeout_s=20)))
    except Exception:
        return False


def _tail(path: Path, n: int = 2500) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def test_workers_redis_and_kafka_fail_under_load_and_verify_finds_no_violation(tmp_path: Path) -> None:
    """Every injected failure leaves the invariants intact: one payload per release_id, every release
    charged, spend = audited charges ≤ cap, nothing published during a Redis outage, every window
    released or refused, values equal to a clean run's."""
    _chaos(tmp_path, ChaosSettings.from_env(), sentinel=False)


def test_workers_die_and_the_sentinel_primary_fails_over_and_verify_finds_no_violation(tmp_path: Path) -> None:
    """The same with the ledger under Sentinel (primary + replica): the primary SIGKILLed and the replica
    promoted while workers die, and the broker restarted (long run only)."""
    _chaos(tmp_path, ChaosSettings.from_env(short_feed_s=48.0), sentinel=True)


def _chaos(tmp_path: Path, settings: ChaosSettings, sentinel: bool) -> None:
    rng = random.Random(int(os.environ.get("DPSTREAM_CHAOS_SEED", "0")) or None)
    servers = Servers.start(tmp_path / "servers", sentinel=sentinel)
    bootstrap = servers.kafka.bootstrap
    sup: Supervisor | None = None
    clean_sup: Supervisor | None = None
    try:
        start = int(time.time()) // WINDOW_S * WINDOW_S + WINDOW_S
        # a budget period that does not end during the run, so what it checks does not depend on the time of
        # day (a run that crossed UTC midnight saw its late windows priced out at the period's end)
        period, _ = choose_period(start, PERIODS, int(settings.feed_s) + RUN_MARGIN_S)
        chaos = write_topology(tmp_path, bootstrap, start, EPSILON, None, period)
        clean = write_topology(tmp_path, bootstrap, start, EPSILON, chaos.sources["clicks"].topic, period)
        chaos_path = tmp_path / chaos.sinks.releases.removesuffix(".releases") / "topology.yaml"
        clean_path = tmp_path / clean.sinks.releases.removesuffix(".releases") / "topology.yaml"
        sup = Supervisor(chaos_path, bootstrap, servers.ledger_url, [Slot("w1", 0), Slot("w2", 1)], rng)
        clean_sup = Supervisor(clean_path, bootstrap, servers.clean_redis.url, [Slot("clean", 0)], rng)
        sup.start()
        clean_sup.start()
        _wait_first_release(bootstrap, chaos.sinks.releases, chaos_path, sup, clean_sup)

        watcher = ReleaseWatcher(bootstrap, chaos.sinks.releases).begin()  # lags by receive time, not Kafka time
        feed_start = time.time()
        feed_end = feed_start + settings.feed_s
        producer = Producer(bootstrap, chaos.sources["clicks"].topic, settings.rate, feed_end, rng.randrange(1 << 30))
        producer.start()
        outages: list[tuple[float, float]] = []
        kafka_down: list[tuple[float, float]] = []
        long_run = settings.feed_s > 120
        plan, rounds = _injection_plan(settings, feed_start, sentinel, long_run)
        _run_plan(plan, settings, feed_end, servers, sup, clean_sup, outages, kafka_down)
        sup.arm = {}  # the feed is over: restarts are no longer armed
        producer.join(timeout=240)
        assert producer.error is None, repr(producer.error)

        # drain: every window closing by the feed's end comes out (both deployments)
        until = feed_end
        _drain(settings, bootstrap, servers, sup, clean_sup, chaos, clean, until, outages)
        drained_at = time.time()

        verdict, doc = _verify_cli(chaos_path, clean.sinks.releases, bootstrap, servers.ledger_url, until, outages)
        lines = [f"VIOLATION {v['kind']}: {v['message']}" for v in doc["violations"]]

        watcher.stop()
        lags = release_lags(watcher.received, feed_start, feed_end)
        kinds = _injection_kinds(sup)
        worker_kills = sum(n for kind, n in kinds.items() if kind.startswith(("worker_sigkill", "worker_crash_")))
        unplanned = kinds.pop("worker_exit", 0)  # a worker that exited by itself (e.g. ledger down at start)
        figures = {
            "setting": "long" if long_run else "ci",
            "ledger": "sentinel" if sentinel else "redis",
            "feed_s": settings.feed_s,
            "events": producer.sent,
            "injections": sum(kinds.values()),
            "injections_by_kind": kinds,
            "worker_kills": worker_kills,
            "worker_exits_unplanned": unplanned,
            "redis_outages_s": [round(b - a, 1) for a, b in outages],
            "kafka_down_s": [round(b - a, 1) for a, b in kafka_down],
            "windows_checked": doc["counts"].get("windows_checked"),
            "windows_released": doc["counts"].get("windows_released"),
            "windows_refused": doc["counts"].get("windows_refused"),
            "release_ids": doc["counts"].get("release_ids"),
            "duplicates_identical": doc["counts"].get("duplicates_identical"),
            "compared_windows": doc["counts"].get("compared_windows"),
            "published_in_outages": doc["counts"].get("published_in_outages"),
            "violations": len(doc["violations"]),
            "release_lag_during_injections_s": {
                "n": len(lags),
                "p50": round(percentile(lags, 0.5), 2),
                "p99": round(percentile(lags, 0.99), 2),
                "max": round(max(lags), 2) if lags else None,
            },
            "drain_s_after_feed": round(drained_at - feed_end, 1),
            "verify_exit": verdict.returncode,
            "timeline": [[round(i.at - feed_start, 1), i.kind, i.detail] for i in sup.injections],
        }
        _write_figures(tmp_path, figures)
        print("\nCHAOS FIGURES " + json.dumps(figures))
        print("\n".join(lines) or "verify: ok")

        logs = "\n".join(_tail(chaos_path.parent / f"{n}.log", 1500) for n in ("w1", "w2"))
        assert verdict.returncode == 0 and doc["ok"] is True, "\n".join(lines)[-4000:] + verdict.stderr[-2000:] + logs
        assert doc["violations"] == []
        assert doc["counts"]["windows_checked"] >= 3 * settings.feed_s / WINDOW_S - 6  # three metrics, the whole feed
        # every window scheduled up to --until was compared with the clean run (both keep releasing empty windows
        # after that on their own clocks, so the releases past it may be in one topic and not yet the other)
        assert doc["counts"]["compared_windows"] >= doc["counts"]["windows_checked"]
        _assert_injected(kinds, rounds, worker_kills, sentinel, long_run)
    finally:
        for s in (sup, clean_sup):
            if s is not None:
                s.stop()
        servers.stop()


def _wait_first_release(bootstrap: str, topic: str, chaos_path: Path, sup: Supervisor, clean_sup: Supervisor) -> None:
    """Both deployments tended until the chaos one has released (at most 180 s)."""
    deadline = time.monotonic() + 180
    while not _ready(bootstrap, topic) and time.monotonic() < deadline:
        sup.tend()
        clean_sup.tend()
        time.sleep(1)
    assert _ready(bootstrap, topic), _tail(chaos_path.parent / "w1.log")


def _injection_plan(
    settings: ChaosSettings, feed_start: float, sentinel: bool, long_run: bool
) -> tuple[list[tuple[float, str]], int]:
    """The injections of every round, in time order, and the number of rounds."""
    plan: list[tuple[float, str]] = []
    c = settings.cycle_s
    k = 0
    while k * c < settings.feed_s - 0.5 * c or k == 0:
        base = feed_start + k * c
        plan += [(base, "arm"), (base + 0.12 * c, "worker_sigkill"), (base + 0.88 * c, "worker_sigkill")]
        if sentinel:
            plan += [(base + 0.35 * c, "redis_failover")]
            plan += [(base + 0.70 * c, "kafka_restart")] if long_run else []
        else:
            plan += [(base + 0.25 * c, "redis_sigkill"), (base + 0.40 * c, "redis_stop")]
            plan += [(base + 0.70 * c, "kafka_restart")]
        k += 1
    plan.sort()
    return plan, k


def _run_plan(
    plan: list[tuple[float, str]],
    settings: ChaosSettings,
    feed_end: float,
    servers: Servers,
    sup: Supervisor,
    clean_sup: Supervisor,
    outages: list[tuple[float, float]],
    kafka_down: list[tuple[float, float]],
) -> None:
    """Each injection at its time while the feed runs (none while Redis is stopped), Redis started again
    after its pause; outages and broker downtimes appended as they end."""
    redis_back_at: float | None = None
    down_since = 0.0
    while time.time() < feed_end or redis_back_at is not None or plan:
        now = time.time()
        if redis_back_at is not None and now >= redis_back_at:
            servers.redis.start()
            outages.append((down_since, time.time()))
            redis_back_at = None
            sup.paused = False
        while plan and plan[0][0] <= now and redis_back_at is None:
            _, action = plan.pop(0)
            stopped_at = _inject(action, settings, servers, sup, clean_sup, outages, kafka_down)
            if stopped_at is not None:
                down_since = stopped_at
                redis_back_at = down_since + settings.redis_pause_s
        sup.tend()
        clean_sup.tend()
        time.sleep(0.2)


def _inject(
    action: str,
    settings: ChaosSettings,
    servers: Servers,
    sup: Supervisor,
    clean_sup: Supervisor,
    outages: list[tuple[float, float]],
    kafka_down: list[tuple[float, float]],
) -> float | None:
    """One planned injection; for `redis_stop`, the time Redis has exited (the caller starts it again)."""
    if action == "arm":
        for step in ("after_charge", "after_publish"):
            sup.arm[step] = sup.arm.get(step, 0) + 1
    elif action == "worker_sigkill":
        sup.kill_random()
    elif action == "redis_sigkill":
        sup.paused = True
        t0 = time.time()
        servers.redis.kill()
        sup.injections.append(Injection("redis_sigkill", t0))
        servers.redis.start()
        outages.append((t0, time.time()))
        sup.paused = False
    elif action == "redis_failover":
        sup.paused = True
        t0, t1 = servers.failover()
        outages.append((t0, t1))
        sup.injections.append(Injection("redis_failover", t0, f"promoted after {t1 - t0:.1f} s"))
        sup.paused = False
    elif action == "redis_stop":
        sup.paused = True
        servers.redis.stop()
        # the outage starts when Redis has exited: after SIGTERM it serves until its next cron tick
        # (up to 100 ms), so a charge then is made before the outage, and its publish is legitimate
        down_since = time.time()
        sup.injections.append(Injection("redis_stop", down_since, f"{settings.redis_pause_s:g} s"))
        return down_since
    elif action == "kafka_restart":
        sup.paused = clean_sup.paused = True
        t0 = time.time()
        servers.kafka.stop()
        servers.kafka.start()
        kafka_down.append((t0, time.time()))
        sup.injections.append(Injection("kafka_restart", t0, f"{time.time() - t0:.1f} s down"))
        sup.paused = clean_sup.paused = False
    return None


def _drain(
    settings: ChaosSettings,
    bootstrap: str,
    servers: Servers,
    sup: Supervisor,
    clean_sup: Supervisor,
    chaos: Any,
    clean: Any,
    until: float,
    outages: list[tuple[float, float]],
) -> None:
    """Both deployments tended until in-process verify passes for each (at most `settings.drain_s`)."""
    deadline = time.monotonic() + settings.drain_s
    done_chaos = done_clean = None
    while time.monotonic() < deadline:
        sup.tend()
        clean_sup.tend()
        done_chaos = done_chaos or _verify_ok(chaos, bootstrap, servers.ledger_url, until, outages)
        if done_chaos is not None and not done_chaos.ok:
            done_chaos = None
        done_clean = done_clean or _verify_ok(clean, bootstrap, servers.clean_redis.url, until, [])
        if done_clean is not None and not done_clean.ok:
            done_clean = None
        if done_chaos and done_clean:
            break
        time.sleep(3)


def _verify_cli(
    chaos_path: Path,
    clean_releases: str,
    bootstrap: str,
    ledger_url: str,
    until: float,
    outages: list[tuple[float, float]],
) -> tuple[subprocess.CompletedProcess[str], Any]:
    """`dpstream verify --json` (a subprocess) on the chaos deployment, compared to the clean run's releases."""
    argv = [sys.executable, "-m", "dpstream.workers.cli", "verify", "--topology", str(chaos_path)]
    argv += ["--bootstrap", bootstrap, "--redis", ledger_url, "--grace", "0", "--until", f"{until:.3f}"]
    argv += [arg for a, b in outages for arg in ("--outage", f"{a:.3f}/{b:.3f}")]
    argv += ["--compare-to", clean_releases]
    verdict = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=300)
    return verdict, json.loads(verdict.stdout)


def _injection_kinds(sup: Supervisor) -> dict[str, int]:
    """How many injections (and crash-hook kills, and unplanned exits) of each kind."""
    kinds: dict[str, int] = {}
    for inj in sup.injections:
        kinds[inj.kind] = kinds.get(inj.kind, 0) + 1
    return kinds


def _write_figures(tmp_path: Path, figures: dict[str, Any]) -> None:
    """figures.json in the test's directory, and at $DPSTREAM_CHAOS_FIGURES if set."""
    (tmp_path / "figures.json").write_text(json.dumps(figures, indent=2))
    if os.environ.get("DPSTREAM_CHAOS_FIGURES"):
        Path(os.environ["DPSTREAM_CHAOS_FIGURES"]).write_text(json.dumps(figures, indent=2))


def _assert_injected(kinds: dict[str, int], rounds: int, worker_kills: int, sentinel: bool, long_run: bool) -> None:
    """Every planned kind of injection happened in every round, both crash hooks fired (and the long run
    killed workers at least 20 times)."""
    required = ["worker_sigkill", *(["redis_failover"] if sentinel else ["redis_sigkill", "redis_stop"])]
    required += ["kafka_restart"] if long_run or not sentinel else []
    for kind in required:
        assert kinds.get(kind, 0) >= rounds, (kind, kinds)
    for step in ("after_charge", "after_publish"):
        assert kinds.get(f"worker_crash_{step}", 0) >= 1, (step, kinds)
    if long_run:
        assert worker_kills >= 20, kinds


@pytest.mark.unit
def test_the_crash_hook_is_off_unless_armed() -> None:
    """The hook needs both variables (a stray DPSTREAM_CHAOS_CRASH does nothing); armed, it kills the
    process on the planned pass; a malformed armed value is an error, not silently ignored."""
    code = (
        "from dpstream.workers.release.faults import crash_point\n"
        "for i in range(5):\n"
        "    crash_point('after_publish'); crash_point('after_charge'); print(i, flush=True)\n"
    )

    def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("DPSTREAM_CHAOS_")}
        return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True)

    off = run({"DPSTREAM_CHAOS_CRASH": "after_charge@1"})
    assert off.returncode == 0 and off.stdout.split() == ["0", "1", "2", "3", "4"]
    wrong = run({"DPSTREAM_CHAOS_CRASH": "after_charge@1", "DPSTREAM_CHAOS_ARMED": "yes"})
    assert wrong.returncode == 0 and wrong.stdout.split() == ["0", "1", "2", "3", "4"]
    armed = {"DPSTREAM_CHAOS_ARMED": "crash-this-worker-for-a-chaos-test"}
    dead = run({**armed, "DPSTREAM_CHAOS_CRASH": "after_charge@3"})
    assert dead.returncode == -9 and dead.stdout.split() == ["0", "1"]
    bad = run({**armed, "DPSTREAM_CHAOS_CRASH": "before_lunch@1"})
    assert bad.returncode != 0 and "DPSTREAM_CHAOS_CRASH" in bad.stderr
