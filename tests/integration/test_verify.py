"""`dpstream verify` against a live deployment (real Kafka + Redis, a real worker), and its pure checks.

A clean run verifies with exit 0; then each kind of violation is injected (a second payload under a
published release_id, a release without a charge, windows left unreleased, a tampered ledger, a
compared run whose value differs) and verify names each one in its own line and exits 1.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from dpstream.topology.model import DEFAULT_PUBLISH_DELAY_S
from dpstream.topology.periods import period_id
from dpstream.workers.cli import main
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.keys import ScopeKeys
from dpstream.workers.ledger.types import PeriodReconcile, PeriodSummary, ReconcileReport
from dpstream.workers.release.ids import release_id
from dpstream.workers.verify import checks
from dpstream.workers.verify.report import KINDS, Violation
from dpstream.workers.verify.sources import LedgerRelease, TopicRecord
from tests.e2e.harness import Deployment, deploy, event, poll, read_all, send

pytestmark = pytest.mark.integration

WINDOW = 2


def _verify(dep: Deployment, capsys: pytest.CaptureFixture[str], *extra: str, json_out: bool = True) -> tuple[int, Any]:
    """Run `dpstream verify` in-process; (exit code, parsed JSON or the text lines)."""
    capsys.readouterr()
    argv = ["verify", "--topology", str(dep.path), "--bootstrap", dep.bootstrap, "--redis", dep.redis_url, *extra]
    code = main([*argv, "--json"] if json_out else argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, (json.loads(out) if json_out else out.splitlines())


def _kinds(doc: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for v in doc["violations"]:
        out.setdefault(v["kind"], []).append(v)
    return out


def _records(dep: Deployment) -> list[tuple[bytes | None, bytes]]:
    return read_all(dep.bootstrap, dep.topology.sinks.releases)


def test_live_deployment_verifies_then_each_injected_violation_is_named(
    tmp_path: Path, kafka_broker: Any, fresh_redis: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Clean run → exit 0 with counts; breaker-refused windows count as refused; then a second payload, an
    uncharged release, unreleased windows and a tampered ledger are each named, exit 1."""
    dep = deploy(tmp_path, kafka_broker.bootstrap, fresh_redis.url)
    try:
        start = dep.topology.schedule_start
        assert start is not None
        dep.start_worker("w1")
        t0 = (int(time.time()) // WINDOW + 1) * WINDOW
        send(
            dep.bootstrap,
            dep.source_topic,
            [
                event(f"u{i}", t0 + k * WINDOW + 0.5, "home" if i % 2 else "cart", float(i))
                for k in range(3)
                for i in range(30)
            ],
        )

        # 1. clean: every window due 20 s ago is released (the worker catches up from S on its own)
        def clean() -> Any:
            code, doc = _verify(dep, capsys, "--grace", "20")
            return (code, doc) if code == 0 and doc["counts"]["windows_checked"] >= 8 else None

        got = poll(clean, timeout_s=150, every_s=2)
        assert got, (_verify(dep, capsys, "--grace", "20", json_out=False)[1][-12:], dep.log("w1")[-3000:])
        code, doc = got
        assert doc["ok"] is True and doc["violations"] == [] and doc["verify_version"] == 2
        c = doc["counts"]
        assert c["releases"] >= c["release_ids"] >= c["windows_released"] == c["windows_checked"] >= 8
        assert c["windows_missing"] == 0 and c["release_ids_charged"] == c["release_ids"]
        assert c["duplicates_identical"] == c["releases"] - c["release_ids"]
        assert c["scopes_checked"] == 1 and c["periods_checked"] >= 1
        assert doc["schedule"]["start"] == start and doc["schedule"]["source"] == "topology"
        code, lines = _verify(dep, capsys, "--grace", "20", json_out=False)
        assert code == 0 and len(lines) == 1 and lines[0].startswith("verify: ok: ")
        assert "duplicates byte-identical" in lines[0] and "windows checked" in lines[0]

        # 2. a manually opened breaker: windows are refused by the ledger with a reason, which is not a violation
        async def breaker() -> None:
            ledger = await open_ledger(dep.redis_url, None)
            try:
                await ledger.open_breaker("b", "verify test", "tester")
            finally:
                await ledger.close()

        asyncio.run(breaker())

        def refused() -> Any:
            code, doc = _verify(dep, capsys, "--grace", "20")
            return doc if code == 0 and doc["counts"]["windows_refused"] >= 2 else None

        doc = poll(refused, timeout_s=90, every_s=2)
        assert doc, (_verify(dep, capsys, "--grace", "20"), dep.log("w1")[-2000:])

        # 3. stop the worker: windows closing from now on are never released
        dep.stop_all()
        stopped = time.time()

        # 4. inject into the releases topic: a different payload under a published release_id, and a
        #    record whose release_id (a real one, of a window far ahead) has no charge
        key, value = next((k, v) for k, v in _records(dep) if json.loads(v)["metric"] == "views")
        victim = json.loads(value)
        forged = dict(victim, values={k: v + 1000.0 for k, v in victim["values"].items()})
        far = (int(time.time()) // WINDOW + 100_000) * WINDOW
        ghost_id = release_id(dep.topology.topology_version, "views", far, far + WINDOW)
        ghost = dict(
            victim, release_id=ghost_id, window=dict(victim["window"], start_epoch=far, end_epoch=far + WINDOW)
        )
        send(
            dep.bootstrap,
            dep.topology.sinks.releases,
            [(key, json.dumps(forged, sort_keys=True).encode()), (ghost_id.encode(), json.dumps(ghost).encode())],
        )

        # 5. tamper with the ledger: one unit of spend the audit stream does not have, and δ above its cap
        pid = period_id(86_400, start)
        with fresh_redis.client() as r:
            blk = ScopeKeys("b").period(pid)
            r.hincrby(blk, "spent", 1)
            r.hset(blk, "delta_spent", int(r.hget(blk, "delta_cap") or 0) + 1)

        time.sleep(max(0.0, stopped + 3 * WINDOW + 2 - time.time()))
        code, doc = _verify(dep, capsys, "--grace", "1")
        assert code == 1 and doc["ok"] is False
        kinds = _kinds(doc)
        assert [v["release_id"] for v in kinds["two_payloads"]] == [victim["release_id"]]
        assert victim["release_id"] in kinds["two_payloads"][0]["message"]
        assert "differ in: values" in kinds["two_payloads"][0]["message"]
        assert [v["release_id"] for v in kinds["payload_mismatch"]] == [victim["release_id"]]  # the forged bytes
        assert [v["release_id"] for v in kinds["uncharged"]] == [ghost_id]
        assert ghost_id in kinds["uncharged"][0]["message"]
        missing = kinds["missing_window"]
        assert len(missing) >= 2 and {v["metric"] for v in missing} == {"views", "spend"}
        for v in missing:
            assert v["window_end"] + 1 > stopped - WINDOW - DEFAULT_PUBLISH_DELAY_S  # closed near the stop, + P(w) wait
            assert v["release_id"] == release_id(
                dep.topology.topology_version, v["metric"], v["window_start"], v["window_end"]
            )
            assert v["release_id"] in v["message"]
        assert [v["period"] for v in kinds["spend_mismatch"]] == [pid]
        assert [v["period"] for v in kinds["delta_over_cap"]] == [pid]
        assert set(kinds) == {
            "two_payloads",
            "payload_mismatch",
            "uncharged",
            "missing_window",
            "spend_mismatch",
            "delta_over_cap",
        }
        assert doc["counts"]["windows_missing"] == len(missing)

        # the text form: one line per violation, each naming its kind, then the summary
        code, lines = _verify(dep, capsys, "--grace", "1", json_out=False)
        assert code == 1
        assert len(lines) >= len(doc["violations"]) + 1  # more windows may have closed since
        assert all(line.startswith("VIOLATION ") for line in lines[:-1])
        assert lines[-1].startswith(f"verify: {len(lines) - 1} violation(s): ")
        assert {line.split(":", 1)[0].removeprefix("VIOLATION ") for line in lines[:-1]} == set(kinds)

        # over the cap
        with fresh_redis.client() as r:
            r.hset(blk, "spent", int(r.hget(blk, "cap")) + 1)
        code, doc = _verify(dep, capsys, "--grace", "1")
        assert code == 1 and [v["period"] for v in _kinds(doc)["over_cap"]] == [pid]
    finally:
        dep.stop_all()


def test_compare_to_another_runs_releases(
    tmp_path: Path, kafka_broker: Any, fresh_redis: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """--compare-to: the same releases match; a copy with one value moved far off is named, and so is
    a topic without any window in common."""
    dep = deploy(tmp_path, kafka_broker.bootstrap, fresh_redis.url, epsilon=1000.0)
    try:
        dep.start_worker("w1")
        t0 = (int(time.time()) // WINDOW + 1) * WINDOW
        send(dep.bootstrap, dep.source_topic, [event(f"u{i}", t0 + 0.5, "home", 5.0) for i in range(10)])
        assert poll(lambda: len(_records(dep)) >= 6, timeout_s=150), dep.log("w1")[-3000:]
        dep.stop_all()
        records = _records(dep)
        ids = [json.loads(v)["release_id"] for _k, v in records]
        pick = next(i for i, rid in enumerate(ids) if ids.count(rid) == 1)
        copy = kafka_broker.new_topic("verify-copy")
        moved = json.loads(records[pick][1])
        moved_key = next(iter(moved["values"]))
        half = moved["ci"]["half_width"]
        shift = 10.0 * (half[moved_key] if isinstance(half, dict) else half) + 50.0  # far outside 3 × both CIs
        moved["values"][moved_key] += shift
        rest = [kv for i, kv in enumerate(records) if i != pick]
        send(dep.bootstrap, copy, [*rest, (records[pick][0], json.dumps(moved).encode())])
        code, doc = _verify(dep, capsys, "--grace", "3600", "--compare-to", copy)
        assert code == 1, doc
        kinds = _kinds(doc)
        assert set(kinds) == {"value_mismatch"}
        assert [v["release_id"] for v in kinds["value_mismatch"]] == [moved["release_id"]]
        assert repr(moved_key) in kinds["value_mismatch"][0]["message"]
        assert doc["counts"]["compared_windows"] == len({json.loads(v)["release_id"] for _k, v in records})
        code, doc = _verify(dep, capsys, "--grace", "3600", "--compare-to", copy, "--tolerance", str(2 * shift))
        assert code == 0, doc
        empty = kafka_broker.new_topic("verify-empty")
        code, doc = _verify(dep, capsys, "--grace", "3600", "--compare-to", empty)
        assert code == 1 and set(_kinds(doc)) == {"compare_empty"}
    finally:
        dep.stop_all()


def test_usage_errors_exit_2_with_one_line(
    tmp_path: Path, kafka_broker: Any, fresh_redis: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing topology, a bad --grace or --since, --tolerance without --compare-to, a missing compare
    topic, an unreachable broker: exit 2 with one line."""
    dep = deploy(tmp_path, kafka_broker.bootstrap, fresh_redis.url)
    base = ["verify", "--bootstrap", dep.bootstrap, "--redis", dep.redis_url]
    cases = [
        [*base, "--topology", str(tmp_path / "nope.yaml")],
        [*base, "--topology", str(dep.path), "--grace", "-1"],
        [*base, "--topology", str(dep.path), "--tolerance", "1"],
        [*base, "--topology", str(dep.path), "--since", "yesterday-ish"],
        [*base, "--topology", str(dep.path), "--compare-to", "no-such-topic-xyz"],
        ["verify", "--topology", str(dep.path), "--bootstrap", "127.0.0.1:1", "--redis", dep.redis_url],
        [*base, "--topology", str(dep.path), "--outage", "100"],
        [*base, "--topology", str(dep.path), "--outage", "200/100"],
        [*base, "--topology", str(dep.path), "--outage", "x/200"],
        [*base, "--topology", str(dep.path), "--until", "nan"],
    ]
    for argv in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and err.startswith("dpstream: error: "), (argv, err)
    # nothing started: the scope is not registered and no release exists; a declared start still gives a schedule
    capsys.readouterr()
    code = main(
        [
            "verify",
            "--topology",
            str(dep.path),
            "--bootstrap",
            dep.bootstrap,
            "--redis",
            dep.redis_url,
            "--grace",
            "0",
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and "scope_not_registered" in _kinds(doc)


# ---- the pure checks -----------------------------------------------------------------------


def _rec(offset: int, key: bytes | None, value: bytes | None, partition: int = 0) -> TopicRecord:
    return TopicRecord(partition, offset, key, value, 0)


def _doc(rid: str, **extra: Any) -> bytes:
    return json.dumps({"release_id": rid, "metric": "m", "values": {"": 1.0}, **extra}, sort_keys=True).encode()


@pytest.mark.unit
def test_index_releases_names_two_payloads_malformed_and_key_mismatch() -> None:
    counts: dict[str, Any] = {}
    recs = [
        _rec(0, b"a", _doc("a")),
        _rec(1, b"a", _doc("a")),
        _rec(2, b"a", _doc("a", values={"": 2.0})),
        _rec(3, b"x", b"{not json"),
        _rec(4, None, None),
        _rec(5, b"zzz", _doc("b")),
    ]
    published, violations = checks.index_releases(recs, counts)
    assert counts == {"releases": 6, "release_ids": 2, "duplicates_identical": 1}
    assert [v.kind for v in violations] == ["two_payloads", "malformed_release", "malformed_release", "release_key"]
    assert "differ in: values" in violations[0].message
    assert len(published["a"].payloads) == 2 and published["a"].copies == 3
    assert all("\n" not in v.line() and v.line().startswith(f"VIOLATION {v.kind}: ") for v in violations)


@pytest.mark.unit
def test_charges_states_and_stored_payload() -> None:
    published, _ = checks.index_releases(
        [_rec(0, b"a", _doc("a")), _rec(1, b"b", _doc("b")), _rec(2, b"c", _doc("c")), _rec(3, b"d", _doc("d"))], {}
    )
    found = {
        "a": LedgerRelease("s", "a", "published", _doc("a"), "m", 0, 1),
        "b": LedgerRelease("s", "b", "charged", _doc("b", values={"": 9.0}), "m", 0, 1),
        "c": LedgerRelease("s", "c", "weird", _doc("c"), "m", 0, 1),
    }
    counts: dict[str, Any] = {}
    kinds = [(v.kind, v.details["release_id"]) for v in checks.check_charges(published, found, counts)]
    assert kinds == [("payload_mismatch", "b"), ("charge_state", "c"), ("uncharged", "d")]
    assert counts == {"release_ids_charged": 2}


@pytest.mark.unit
def test_budget_check_compares_spend_with_the_audit_and_caps() -> None:
    report = ReconcileReport("s", (PeriodReconcile("p1", 10, 10, 1, 1), PeriodReconcile("p2", 11, 10, 2, 2)))
    blocks = [PeriodSummary("p1", 0, 100, 0, 10, 1, 0, 0, 5, 5), PeriodSummary("p2", 0, 10, 0, 11, 2, 0, 0, 6, 5)]
    counts: dict[str, Any] = {}
    assert [v.kind for v in checks.check_budget(report, blocks, counts)] == [
        "spend_mismatch",
        "over_cap",
        "delta_over_cap",
    ]
    assert counts["periods_checked"] == 2


@pytest.mark.unit
def test_schedule_starts_at_S_and_ends_at_now_minus_grace() -> None:
    from dpstream.workers.ledger.testing import one_scope_topology

    topo = one_scope_topology(metrics=(("m", 1.0, 60, 60, False),))
    windows = list(checks.scheduled_windows(topo, 1_000_030, 1_000_300))
    assert [(w.start, w.end) for w in windows] == [
        (1_000_080, 1_000_140),
        (1_000_140, 1_000_200),
        (1_000_200, 1_000_260),
    ]
    rids = [w.release_id for w in windows]
    published, _ = checks.index_releases([_rec(0, rids[0].encode(), _doc(rids[0]))], {})
    counts: dict[str, Any] = {}
    violations = checks.check_schedule(
        topo,
        windows,
        published,
        {rids[1]: "breaker open (manual): x"},
        {rids[2]: LedgerRelease("s", rids[2], "charged", b"{}", "m", 0, 1)},
        counts,
    )
    assert [v.kind for v in violations] == ["missing_window"]
    assert "charged but not on the releases topic" in violations[0].message
    assert counts == {"windows_checked": 3, "windows_released": 1, "windows_refused": 1, "windows_missing": 1}


@pytest.mark.unit
def test_outages_name_releases_published_inside_unless_charged_before() -> None:
    """A copy stamped inside an outage is a violation unless its charge predates the outage or follows
    it (stamped with its public time P(w), published late); copies outside every outage, and releases
    charged before it (in flight), are not."""
    recs = [
        TopicRecord(0, 0, b"a", _doc("a"), 1_050_000),  # inside, charged before: in flight, fine
        TopicRecord(0, 1, b"b", _doc("b"), 1_050_000),  # inside, charged inside: violation
        TopicRecord(0, 2, b"c", _doc("c"), 1_200_000),  # outside
        TopicRecord(0, 3, b"c", _doc("c"), 1_070_000),  # a copy of c inside, charged before the outage: fine
        TopicRecord(0, 4, b"d", _doc("d"), 1_099_999),  # inside, no ledger record: violation
        TopicRecord(0, 5, b"e", _doc("e"), 1_090_000),  # stamped P(w) inside, charged after: late, fine
    ]
    published, _ = checks.index_releases(recs, {})
    assert published["c"].stamps == [1_200_000, 1_070_000]
    found = {
        "a": LedgerRelease("s", "a", "published", _doc("a"), "m", 0, 1, 999_000),
        "b": LedgerRelease("s", "b", "published", _doc("b"), "m", 0, 1, 1_040_000),
        "c": LedgerRelease("s", "c", "published", _doc("c"), "m", 0, 1, 500_000),
        "e": LedgerRelease("s", "e", "published", _doc("e"), "m", 0, 1, 1_150_000),
    }
    counts: dict[str, Any] = {}
    violations = checks.check_outages(published, found, [(1000.0, 1100.0)], counts)
    assert [(v.kind, v.details["release_id"]) for v in violations] == [
        ("published_during_outage", "b"),
        ("published_during_outage", "d"),
    ]
    assert "no charge time" in violations[1].message
    assert counts == {"outages": 1, "published_in_outages": 5}
    assert checks.check_outages(published, found, [], {}) == []


@pytest.mark.unit
def test_dead_letters_need_a_known_reason() -> None:
    good = json.dumps({"reason": "not_json", "raw_b64": ""}).encode()
    counts: dict[str, Any] = {}
    violations = checks.check_dead_letters(
        [_rec(0, None, good), _rec(1, None, b'{"reason": "made_up"}'), _rec(2, None, b"\xff")], counts
    )
    assert [v.kind for v in violations] == ["bad_dead_letter", "bad_dead_letter"]
    assert counts == {"dead_letters": 3, "dead_letter_reasons": {"not_json": 1}}


@pytest.mark.unit
def test_every_violation_kind_is_documented() -> None:
    assert all(KINDS[k] for k in KINDS)
    with pytest.raises(ValueError):
        Violation("no_such_kind", "x")
