"""`dpstream budget report` on periods of the web-analytics example driven through `dpstream replay`
onto a real Redis ledger: exact re-accounting, the per-record cost check, tampering, and the advice
checked by a second replay under the advised weights."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpstream.topology.loader import load_topology
from dpstream.workers.cli import main
from dpstream.workers.ledger.keys import ScopeKeys
from dpstream.workers.synthetic import EventGenerator, GeneratorConfig, write_jsonl

pytest.importorskip("dp_accounting")

EXAMPLE = Path(__file__).resolve().parents[2] / "topology" / "examples" / "web-analytics.yaml"
SCOPE = "web-daily"
DAY = 86_400
EVENTS = 20_000
USERS = 2_000


def _db(url: str, db: int) -> str:
    return re.sub(r"/\d*$", f"/{db}", url) if re.search(r":\d+/\d*$", url) else f"{url}/{db}"


def _client(redis_server: Any, db: int) -> Any:
    import redis as redis_py

    return redis_py.Redis.from_url(_db(redis_server.url, db))


def _flush(redis_server: Any, db: int) -> None:
    _client(redis_server, db).flushdb()


def _replay(topology: Path, events: Path, url: str, start: int, end: int, out: Path) -> None:
    args = ["replay", str(topology), str(events), "--ledger", url, "--from", str(start), "--to", str(end)]
    assert main([*args, "--out", str(out)]) == 0


def _report(capsys: pytest.CaptureFixture[str], topology: Path, url: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["budget", "report", "--scope", SCOPE, "--topology", str(topology), "--redis", url, "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def day() -> int:
    """Yesterday's UTC period: a whole past day (the grant is given with the ledger's clock set in it)."""
    now = int(time.time())
    return now - now % DAY - DAY


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory, day: int) -> Path:
    """A day of synthetic clicks for the example (seeded)."""
    path = tmp_path_factory.mktemp("report") / "events.jsonl"
    topo = load_topology(EXAMPLE)
    gen = EventGenerator(topo, config=GeneratorConfig(users=USERS, seed=13, start_ts=day + 0.5))
    write_jsonl(path, gen.events(EVENTS, rate=EVENTS / DAY))
    return path


@pytest.fixture(scope="module")
def capped(redis_server: Any, events: Path, day: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Period A on db 3: the morning replayed, the reserve granted by an operator (at noon of that
    day), the afternoon replayed, so the period's spend reaches the cap."""
    url = _db(redis_server.url, 3)
    _flush(redis_server, 3)
    tmp = tmp_path_factory.mktemp("capped")
    _replay(EXAMPLE, events, url, day, day + DAY // 2, tmp / "am.jsonl")
    reserve = load_topology(EXAMPLE).budgets[SCOPE].reserve
    import asyncio

    from dpstream.workers.ledger import open_ledger

    async def grant() -> None:
        ledger = await open_ledger(url, load_topology(EXAMPLE), clock=lambda: float(day + DAY // 2))
        status = await ledger.status(SCOPE)
        await ledger.grant_reserve(SCOPE, status.cap * reserve, "report test: draw the reserve", "test")
        await ledger.close()

    asyncio.run(grant())
    _replay(EXAMPLE, events, url, day + DAY // 2, day + DAY, tmp / "pm.jsonl")
    _MORNING["A"] = tmp / "am.jsonl"
    yield url
    _flush(redis_server, 3)


_MORNING: dict[str, Path] = {}
"""The morning's release records of period A (before the grant: on plan under the file's weights)."""


_REPORTS: dict[str, tuple[int, dict[str, Any]]] = {}
"""Reports built once per ledger URL in this module (capsys is function-scoped, so no fixture)."""


def _cached_report(capsys: pytest.CaptureFixture[str], url: str) -> tuple[int, dict[str, Any]]:
    if url not in _REPORTS:
        _REPORTS[url] = _report(capsys, EXAMPLE, url)
    return _REPORTS[url]


def test_tight_pld_within_charged_and_equal_to_dp_accounting(
    capped: str, capsys: pytest.CaptureFixture[str], redis_server: Any
) -> None:
    """At the cap, the report's PLD ε is ≤ the charged ε, and equals dp-accounting run in this test on the
    mechanisms read straight from the stored records, to 1e-6 relative."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    _code, rep = _cached_report(capsys, capped)
    charged, tight = rep["accounting"]["charged"], rep["accounting"]["tight"]
    assert charged["ratio"] > 0.95, charged  # driven to the cap (in warning, noise is stretched: the last few % stay)
    assert tight["pld_epsilon"] <= charged["epsilon"]
    assert charged["epsilon"] <= 1.0 and charged["delta"] <= 1e-6
    # dp-accounting directly: every record's noise, with sensitivities derived here from the topology
    topo = load_topology(EXAMPLE)
    client = _client(redis_server, 3)
    base = ScopeKeys(SCOPE).base
    mu2, topk = 0.0, []
    records = 0
    for key in client.scan_iter(match=f"{base}:release:*", count=1000):
        rec = json.loads(client.hget(key, "payload"))
        records += 1
        m = topo.metrics[rec["metric"]]
        noise = rec["noise"]
        if m.aggregate.value in ("count", "count_units"):
            keys = m.contribution.max_keys if m.group_by else 1
            per_key = m.contribution.max_per_key if m.aggregate.value == "count" else 1
            mu2 += keys * per_key**2 / noise["scale"] ** 2
        elif m.aggregate.value == "sum":
            step = noise["grid_step"]
            units = math.ceil(m.bounds.upper * m.contribution.max_per_key / step) + 1
            mu2 += (units / (noise["scale"] / step)) ** 2
        elif m.aggregate.value == "mean":
            s, c = noise["sum"], noise["count"]
            units = math.ceil((m.bounds.upper - m.bounds.lower) / 2 * m.contribution.max_per_key / s["grid_step"]) + 1
            mu2 += (units / (s["scale"] / s["grid_step"])) ** 2 + (m.contribution.max_per_key / c["scale"]) ** 2
        else:  # top-k: k selections at ε0 = Δ∞/scale on monotone counts, and the Gaussian selection noise
            topk.extend([1.0 / noise["scale"]] * (m.k or 1))
            assert rec["partition_selection"]["mechanism"] == "gaussian_threshold"
            mu2 += _selection_part(topo, rec["cost"]["rho"])
    assert records == rep["accounting"]["record_check"]["checked"]
    pld = pld_lib.from_gaussian_mechanism(1.0 / math.sqrt(mu2), value_discretization_interval=1e-4)
    for eps0 in sorted(set(topk)):
        n = topk.count(eps0)
        one = pld_lib.from_privacy_parameters(common.DifferentialPrivacyParameters(eps0, 0.0), 1e-4)
        pld = pld.compose(one.self_compose(n))
    direct = pld.get_epsilon_for_delta(tight["delta"])
    assert math.isclose(direct, tight["pld_epsilon"], rel_tol=1e-6), (direct, tight["pld_epsilon"])


def _selection_part(topo: Any, rho: float) -> float:
    """(Δ₂/σ)² of a top-k release's partition-selection noise: not in the record, so calibrated from
    the record's cost as the releaser does (OpenDP's scale for its share of the cost)."""
    from dpstream.topology.model import Accounting, Mechanism
    from dpstream.topology.selection import TOP_K_SELECTION_SHARE
    from dpstream.workers.noise.measurements import integer_noise

    c = topo.metrics["top_referrers"].contribution
    l1, l2 = c.max_keys * c.max_per_key, math.sqrt(c.max_keys) * c.max_per_key
    noise = integer_noise(Mechanism.GAUSSIAN, Accounting.ZCDP, rho * TOP_K_SELECTION_SHARE, l1, l2)
    return (l2 / noise.scale) ** 2


def test_every_record_passes_the_cost_check(capped: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each charge of the period has its record, and the record's event maps (OpenDP) to the charge."""
    code, rep = _cached_report(capsys, capped)
    acc = rep["accounting"]
    assert acc["charged"]["reconciles"] and code == 0
    assert acc["record_check"]["checked"] == len(acc["charges"]) == 3280
    assert acc["record_check"]["ok"] == 3280 and acc["record_check"]["flagged"] == []
    assert all(c["check"] == "ok" and c["mechanism"] and c["noise"] for c in acc["charges"])
    assert acc["gap"]["credited"] is False and "adaptive" in acc["gap"]["reason"]


def test_a_tampered_record_is_flagged(capped: str, capsys: pytest.CaptureFixture[str], redis_server: Any) -> None:
    """A record whose event's noise scale is changed in Redis after its charge is flagged, and the report exits 1."""
    client = _client(redis_server, 3)
    key = next(iter(client.scan_iter(match=f"{ScopeKeys(SCOPE).base}:release:*", count=1000)))
    original = client.hget(key, "payload")
    rec = json.loads(original)
    part = rec["event"]["parts"][0]
    part["scale"] = part["scale"] * 1.01
    client.hset(key, "payload", json.dumps(rec, sort_keys=True, separators=(",", ":")))
    try:
        code, rep = _report(capsys, EXAMPLE, capped)
    finally:
        client.hset(key, "payload", original)
    flagged = rep["accounting"]["record_check"]["flagged"]
    assert code == 1 and [f["release_id"] for f in flagged] == [rec["release_id"]]
    assert "privacy maps" in flagged[0]["problems"][0]


def _with_weights(text: str, weights: dict[str, float]) -> str:
    """The topology text with each metric's `weight:` line replaced (metrics are 2-space keys under `metrics:`)."""
    out, section, metric = [], "", ""
    for line in text.splitlines():
        if re.match(r"^\S", line):
            section = line.split(":", 1)[0]
        elif section == "metrics" and re.match(r"^  \w", line):
            metric = line.strip().rstrip(":")
        elif section == "metrics" and re.match(r"^    weight:", line) and metric in weights:
            line = f"    weight: {weights[metric]!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def _truth(day: int) -> Any:
    """The morning's true values per (metric, window), from the same seeded events (test-only)."""
    import dpstream.workers.demo.truth as truth_mod

    truth_mod._KEEP_WINDOWS = 10**6  # keep every closed window of the morning (the demo keeps 64)
    topo = load_topology(EXAMPLE)
    book = truth_mod.TruthBook(topo, day)
    gen = EventGenerator(topo, config=GeneratorConfig(users=USERS, seed=13, start_ts=day + 0.5))
    for ev in gen.events(EVENTS, rate=EVENTS / DAY):
        if ev.ts >= day + DAY // 2:
            break
        book.observe([ev], ev.ts)
    book.close_through(day + DAY // 2 + 3600)
    return book


_EXACT = ("count", "count_units", "sum")
"""Aggregates whose released error is exactly Gaussian noise of the recorded σ (a noisy-ratio mean's σ comes
from a noisy count, and top-k releases keys): the measured sum runs over these."""
_GAUSS_ABS = math.sqrt(2.0 / math.pi)


def _measure(path: Path, book: Any, weights: dict[str, float], mags: dict[str, float]) -> tuple[float, float, float]:
    """(measured Σ w/m·mean|noisy − truth|, its expectation from the records' σ, its sub-Gaussian proxy)."""
    sums: dict[str, list[float]] = {}
    for line in path.read_bytes().splitlines():
        rec = json.loads(line)
        name = rec["metric"]
        if rec["aggregate"] not in _EXACT:
            continue
        truth = book.values(name, rec["window"]["start_epoch"])
        assert truth is not None, (name, rec["window"])
        sigma = rec["noise"]["stddev"]
        acc = sums.setdefault(name, [0.0, 0.0, 0.0, 0])
        for key, noisy in rec["values"].items():
            acc[0] += abs(noisy - truth[key])
            acc[1] += sigma * _GAUSS_ABS
            acc[2] += 2.0 * sigma**2  # |X| − E|X| is sub-Gaussian with proxy 2σ² (see the test's docstring)
            acc[3] += 1
    measured = expected = proxy = 0.0
    for name, (err, exp, var, n) in sums.items():
        f = weights[name] / (mags[name] * n)
        measured, expected, proxy = measured + f * err, expected + f * exp, proxy + f * f * var
    return measured, expected, proxy


def test_advice_predicts_the_fall_of_the_weighted_error(
    capped: str, capsys: pytest.CaptureFixture[str], redis_server: Any, events: Path, day: int, tmp_path: Path
) -> None:
    """Replaying the same morning under the advised weights changes the measured weighted error (importance ×
    |error| / typical magnitude) by what the report predicted: the measured fall is within a noise bound
    (false failure < 1e-6) of the fall expected from the records' σ, which equals the predicted fall to 2 %.

    The bound: a discrete Gaussian X of parameter σ has E e^(λX) ≤ e^(λ²σ²/2) (Canonne-Kamath-Steinke 2020);
    with X' an independent copy, Jensen gives E e^(λ(|X|−E|X|)) ≤ E cosh(λ(|X|−|X'|)) ≤ E cosh(λ(X−X'))
    ≤ e^(λ²·2σ²/2) (cosh is even and grows with |·|, and ||X|−|X'|| ≤ |X−X'|), so each |noisy − truth| is
    sub-Gaussian with proxy 2σ² about its mean, and a weighted sum of independent ones with proxy Σ f²·2σ².
    At this size the bound is comparable to the fall itself: the test pins the size of the fall, not
    merely its sign."""
    _code, rep = _cached_report(capsys, capped)
    adv = rep["advice"]
    rows = {r["metric"]: r for r in adv["metrics"]}
    topo = load_topology(EXAMPLE)
    exact = [n for n in rows if topo.metrics[n].aggregate.value in _EXACT]
    importance = {n: rows[n]["importance"] for n in exact}
    mags = {n: rows[n]["typical_magnitude"] for n in exact}
    predicted_now = sum(importance[n] * rows[n]["c"] / rows[n]["noise_multiplier_now_planned"] / mags[n] for n in exact)
    predicted_adv = sum(importance[n] * rows[n]["expected_abs_error_advised"] / mags[n] for n in exact)
    assert predicted_adv < predicted_now
    advised = tmp_path / "advised.yaml"
    advised.write_text(_with_weights(EXAMPLE.read_text(encoding="utf-8"), adv["weights"]), encoding="utf-8")
    assert {n: m.weight for n, m in load_topology(advised).metrics.items()} == adv["weights"]
    url = _db(redis_server.url, 4)
    _flush(redis_server, 4)
    try:
        _replay(advised, events, url, day, day + DAY // 2, tmp_path / "am_advised.jsonl")
    finally:
        _flush(redis_server, 4)
    book = _truth(day)
    w1, e1, v1 = _measure(_MORNING["A"], book, importance, mags)
    w2, e2, v2 = _measure(tmp_path / "am_advised.jsonl", book, importance, mags)
    bound = math.sqrt(2.0 * (v1 + v2) * math.log(2.0 / 1e-6))
    print(
        f"weighted error: measured {w1:.4g} -> {w2:.4g}, expected {e1:.4g} -> {e2:.4g}, "
        f"predicted {predicted_now:.4g} -> {predicted_adv:.4g}, noise bound {bound:.3g}"
    )
    assert abs((w1 - w2) - (e1 - e2)) <= bound
    assert math.isclose(e1 - e2, predicted_now - predicted_adv, rel_tol=0.02)


def test_demo_ends_by_writing_its_report(capped: str, tmp_path: Path) -> None:
    """`dpstream demo`'s closing step writes the period's report card (JSON and page) and prints its path."""
    from dpstream.workers.demo.run import _write_reports

    said: list[str] = []
    _write_reports(load_topology(EXAMPLE), capped, tmp_path, said.append)
    (line,) = said
    named = re.search(r": (\S+\.html) ", line)
    assert named, line
    page = Path(named[1])
    assert page.exists() and page.with_suffix(".json").exists()
    assert json.loads(page.with_suffix(".json").read_text())["accounting"]["record_check"]["ok"] == 3280
