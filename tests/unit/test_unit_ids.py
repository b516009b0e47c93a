"""Keyed hashing of unit ids at ingest: the secret's checks, the hop's copy, and unchanged bounding."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpstream.topology.dumper import topology_document
from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import UnitHash
from dpstream.workers.pipeline import PartitionPipeline
from dpstream.workers.pipeline.events import MAX_UNIT_LENGTH, EventParser
from dpstream.workers.pipeline.unit_ids import (
    MIN_KEY_BYTES,
    UNIT_HMAC_KEY_ENV,
    UnitHasher,
    check_unit_hashing,
    hashed_copy,
    refusal_reason,
    unit_hasher,
)

SECRET = "s3cret-unit-key-0123456789"

_YAML = """
version: 1
sources:
  clicks: {{topic: t.clicks, privacy_unit: {unit}, timestamp: ts, keyed_by_unit: true{extra}}}
budgets:
  b: {{epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}}
metrics:
  views:
    source: clicks
    budget: b
    window: {{tumbling: 1m}}
    aggregate: count
    group_by: page
    keys: [a, b, c]
    contribution: {{max_keys: 3, max_per_key: 2}}
    mechanism: gaussian
  users:
    source: clicks
    budget: b
    window: {{tumbling: 1m}}
    aggregate: count_units
    mechanism: gaussian
  spend:
    source: clicks
    budget: b
    window: {{tumbling: 1m}}
    aggregate: sum
    value: eur
    bounds: [0, 10]
    contribution: {{max_per_key: 2}}
    mechanism: gaussian
sinks: {{releases: t.rel, dead_letter: t.dlq}}
"""


def _topology(hashed: bool, unit: str = "user_id") -> Any:
    return load_topology_text(_YAML.format(unit=unit, extra=", privacy_unit_hash: hmac-sha256" if hashed else ""))


class Rec(NamedTuple):
    offset: int
    value: bytes
    key: bytes | None
    timestamp: int | None = None


def test_the_hash_is_keyed_deterministic_and_hides_the_id() -> None:
    """Same key and id → same 64-hex hash; another key → another hash; neither the id nor the key shows."""
    h = UnitHasher(SECRET.encode())
    assert h("alice") == UnitHasher(SECRET.encode())("alice")
    assert h("alice") != UnitHasher(b"another-secret-key-0123")("alice")
    assert h("alice") != h("alice ")
    assert len(h("alice")) == 64 and int(h("alice"), 16) >= 0
    assert "alice" not in h("alice")
    assert SECRET not in repr(h) and SECRET.encode().hex() not in repr(h)


def test_loader_reads_the_option_and_the_dumper_writes_it_back() -> None:
    """`privacy_unit_hash: hmac-sha256` loads as the enum and survives a dump and reload."""
    topology = _topology(hashed=True)
    assert topology.sources["clicks"].privacy_unit_hash is UnitHash.HMAC_SHA256
    doc = topology_document(topology)
    assert doc["sources"]["clicks"]["privacy_unit_hash"] == "hmac-sha256"
    assert _topology(hashed=False).sources["clicks"].privacy_unit_hash is None
    assert "privacy_unit_hash" not in topology_document(_topology(hashed=False))["sources"]["clicks"]


def test_loader_refuses_an_unknown_hash_and_event_level_units() -> None:
    """A misspelt hash name and hashing event-level units are one-line errors naming the field."""
    with pytest.raises(ConfigError, match=r"privacy_unit_hash.*hmac-sha256") as bad:
        load_topology_text(_YAML.format(unit="user_id", extra=", privacy_unit_hash: hmac-sha265"))
    assert "\n" not in str(bad.value)
    with pytest.raises(ConfigError, match=r"privacy_unit_hash .*no unit id to hash with privacy_unit: event"):
        load_topology_text(_YAML.format(unit="event", extra=", privacy_unit_hash: hmac-sha256"))


def test_a_missing_or_short_secret_is_one_line_naming_the_variable_never_the_value() -> None:
    """No secret → ConfigError naming DPSTREAM_UNIT_HMAC_KEY; a short one is refused without echoing it."""
    topology = _topology(hashed=True)
    with pytest.raises(ConfigError, match=rf"source 'clicks': privacy_unit_hash hmac-sha256: .*{UNIT_HMAC_KEY_ENV}"):
        check_unit_hashing(topology, environ={})
    short = "tiny-secret-x"
    assert len(short) < MIN_KEY_BYTES
    with pytest.raises(ConfigError, match=rf"{UNIT_HMAC_KEY_ENV} is shorter than {MIN_KEY_BYTES} bytes") as exc:
        check_unit_hashing(topology, environ={UNIT_HMAC_KEY_ENV: short})
    assert short not in str(exc.value) and "\n" not in str(exc.value)
    check_unit_hashing(topology, environ={UNIT_HMAC_KEY_ENV: SECRET})
    check_unit_hashing(_topology(hashed=False), environ={})
    assert unit_hasher(_topology(hashed=False).sources["clicks"], environ={}) is None


def test_the_pipeline_refuses_to_start_without_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipeline of a hashing source cannot be built without the secret (no silent raw ids)."""
    monkeypatch.delenv(UNIT_HMAC_KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=UNIT_HMAC_KEY_ENV):
        PartitionPipeline(_topology(hashed=True), "clicks", 0, schedule_start=0)


def test_hashed_copy_replaces_the_unit_and_keys_by_the_hash() -> None:
    """The hop's copy carries the hash as unit field and key; ids the parser refuses are not rewritten."""
    h = UnitHasher(SECRET.encode())
    parser = EventParser(_topology(hashed=True).sources["clicks"])
    raw = json.dumps({"user_id": "alice", "ts": 5, "page": "a", "eur": 2.5}).encode()
    got = hashed_copy(raw, parser, h, orjson.loads, orjson.dumps)
    assert got is not None
    value, key = got
    assert b"alice" not in value and key == h("alice").encode()
    assert json.loads(value) == {"user_id": h("alice"), "ts": 5, "page": "a", "eur": 2.5}
    assert hashed_copy(json.dumps({"user_id": 42}).encode(), parser, h, orjson.loads, orjson.dumps) == (
        json.dumps({"user_id": h("42")}, separators=(",", ":")).encode(),
        h("42").encode(),
    )
    for refused in (b"{", b"[1]", b'{"user_id": ""}', b'{"user_id": true}', b'{"ts": 1}'):
        assert hashed_copy(refused, parser, h, orjson.loads, orjson.dumps) is None
    too_long = json.dumps({"user_id": "x" * (MAX_UNIT_LENGTH + 1)}).encode()
    assert hashed_copy(too_long, parser, h, orjson.loads, orjson.dumps) is None
    assert parser.parse(value).unit == h("alice")


def test_an_event_the_hop_cannot_re_encode_is_dead_lettered_as_not_json() -> None:
    """A field the parser never reads needs only to be JSON, but the hop re-encodes a hashed event whole:
    one that orjson refuses (a number past the float range) is dead-lettered by the hop, as not_json;
    the other refusals keep the ingest's reason."""
    h = UnitHasher(SECRET.encode())
    parser = EventParser(_topology(hashed=True).sources["clicks"])
    raw = b'{"user_id": "alice", "ts": 5, "note": 1e999}'
    assert parser.parse(raw).unit == "alice"
    assert hashed_copy(raw, parser, h, orjson.loads, orjson.dumps) is None
    assert refusal_reason(raw, parser) == "not_json"
    assert refusal_reason(b'{"user_id": true}', parser) == "bad_unit"


_UNITS = st.sampled_from(["alice", "bob", "carol", "ünï", "用户", "42"]) | st.integers(0, 3)
_EVENTS = st.lists(
    st.fixed_dictionaries(
        {"user_id": _UNITS, "ts": st.integers(0, 179), "page": st.sampled_from("abcd"), "eur": st.integers(-5, 20)}
    ),
    max_size=60,
)


def _run(hashed: bool, events: list[dict[str, Any]]) -> tuple[list[tuple[str, int, dict[str, Any]]], list[str]]:
    pipe = PartitionPipeline(_topology(hashed), "clicks", 0, schedule_start=0, check_keys=True)
    recs = [Rec(i, json.dumps(e).encode(), str(e["user_id"]).encode()) for i, e in enumerate(events)]
    out = pipe.process_batch(recs)
    partials = out.partials + pipe.flush().partials
    return sorted((p.metric, p.start, p.values) for p in partials), [d.reason for d in out.dead_letters]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_EVENTS)
def test_bounding_and_aggregates_are_the_same_with_hashing(monkeypatch: pytest.MonkeyPatch, events: list) -> None:
    """Per-unit L∞ caps count the same events with and without hashing (the raw Kafka key is still checked).
    L0 never binds here (max_keys = the 3 declared keys): it keeps the keys with the smallest public hash of
    the unit id as the pipeline sees it, so a hashed id legitimately keeps other keys than the raw one.

    The environment is set the same for every example (the fixture's one setenv is all it does)."""
    monkeypatch.setenv(UNIT_HMAC_KEY_ENV, SECRET)
    plain = _run(False, events)
    assert _run(True, events) == plain
    assert plain[1] == []


def test_worker_without_the_secret_exits_2_with_one_line(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dpstream worker` on a hashing topology without the secret stops before connecting: one line, exit 2."""
    from dpstream.workers.cli import main

    monkeypatch.delenv(UNIT_HMAC_KEY_ENV, raising=False)
    path = tmp_path / "topology.yaml"
    path.write_text(_YAML.format(unit="user_id", extra=", privacy_unit_hash: hmac-sha256"))
    assert main(["worker", str(path), "--bootstrap", "127.0.0.1:1", "--redis", "redis://127.0.0.1:1/0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and UNIT_HMAC_KEY_ENV in err and "Traceback" not in err, err


def test_refusal_reason_names_what_the_ingest_would_say() -> None:
    """An event the hop cannot rewrite gets the parser's reason (the hop dead-letters it in place)."""
    parser = EventParser(_topology(hashed=True).sources["clicks"])
    cases = {b"{": "not_json", None: "not_json", b"[1]": "not_object", b'{"ts": 1}': "missing_unit"}
    cases[b'{"user_id": true}'] = "bad_unit"
    cases[json.dumps({"user_id": "x" * (MAX_UNIT_LENGTH + 1)}).encode()] = "bad_unit"
    h = UnitHasher(SECRET.encode())
    for raw, reason in cases.items():
        assert raw is None or hashed_copy(raw, parser, h, orjson.loads, orjson.dumps) is None
        assert refusal_reason(raw, parser) == reason, raw


def test_replay_without_the_secret_exits_2_before_touching_the_ledger(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dpstream replay` on a hashing topology without the secret: one line naming the variable, exit 2."""
    from dpstream.workers.cli import main

    monkeypatch.delenv(UNIT_HMAC_KEY_ENV, raising=False)
    path = tmp_path / "topology.yaml"
    path.write_text(_YAML.format(unit="user_id", extra=", privacy_unit_hash: hmac-sha256"))
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"user_id": "alice", "ts": 5, "page": "a"}) + "\n")
    argv = ["replay", str(path), str(events), "--ledger", "redis://127.0.0.1:1/0", "--from", "0", "--to", "60"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and UNIT_HMAC_KEY_ENV in err, err
    monkeypatch.setenv(UNIT_HMAC_KEY_ENV, SECRET)
    assert main([*argv[:4], "memory", *argv[5:], "--out", str(tmp_path / "out.jsonl")]) == 0


def test_the_hasher_remembers_a_bounded_number_of_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """The id → hash cache is cleared when full and answers exactly as the bare HMAC does."""
    import hashlib
    import hmac

    from dpstream.workers.pipeline import unit_ids

    monkeypatch.setattr(unit_ids, "CACHE_SIZE", 8)
    h = UnitHasher(SECRET.encode())
    for i in [*range(20), *range(20)]:
        assert h(f"u{i}") == hmac.new(SECRET.encode(), f"u{i}".encode(), hashlib.sha256).hexdigest()
        assert len(h._cache) <= 8
