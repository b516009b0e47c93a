"""Keyed hashing of privacy unit ids at ingest (`privacy_unit_hash: hmac-sha256` on a source).

With it on, a raw unit id lives only in the source topic (and in a dead letter's raw payload): the
ingest pipeline bounds by HMAC(secret, id), and the repartition hop forwards events whose unit field
and Kafka key are that hash. HMAC-SHA-256 is injective in practice, so bounding, and every release,
is the same as without it. The secret comes from the environment, never from the topology file, and
is never printed.
"""

from __future__ import annotations

__all__ = [
    "UNIT_HMAC_KEY_ENV",
    "MIN_KEY_BYTES",
    "UnitHasher",
    "unit_hasher",
    "check_unit_hashing",
    "hashed_copy",
    "refusal_reason",
]

import hashlib
import hmac
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dpstream.topology.errors import ConfigError, EventError
from dpstream.topology.model import Source, Topology, UnitHash
from dpstream.workers.pipeline.events import EventParser

UNIT_HMAC_KEY_ENV = "DPSTREAM_UNIT_HMAC_KEY"
"""The environment variable holding the HMAC secret (the same value on every worker of a deployment)."""

MIN_KEY_BYTES = 16
"""A shorter secret is refused: unit ids are guessable, so the key is all that hides them."""


CACHE_SIZE = 1 << 16
"""Unit ids whose hash a hasher remembers (HMAC-SHA-256 costs ~3 µs, a dict hit ~0.1 µs; units recur)."""


@dataclass(frozen=True)
class UnitHasher:
    """unit id → hex HMAC-SHA-256 of its UTF-8 bytes under the deployment's secret.

    Remembers the last CACHE_SIZE ids (forgotten all at once when full): in process memory only, which
    holds each event's raw id while it is parsed anyway.
    """

    key: bytes = field(repr=False)
    """The secret (kept out of repr, so no log or traceback can show it)."""
    _cache: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __call__(self, unit: str) -> str:
        cached = self._cache.get(unit)
        if cached is not None:
            return cached
        if len(self._cache) >= CACHE_SIZE:
            self._cache.clear()
        hashed = self._cache[unit] = hmac.digest(self.key, unit.encode("utf-8", "surrogatepass"), hashlib.sha256).hex()
        return hashed


def unit_hasher(source: Source, environ: Mapping[str, str] | None = None) -> UnitHasher | None:
    """The source's hasher (None when it keeps raw ids); ConfigError when the secret is missing or short."""
    if source.privacy_unit_hash is None:
        return None
    assert source.privacy_unit_hash is UnitHash.HMAC_SHA256
    secret = (os.environ if environ is None else environ).get(UNIT_HMAC_KEY_ENV, "")
    where = f"source '{source.name}': privacy_unit_hash {source.privacy_unit_hash.value}"
    if not secret:
        raise ConfigError(
            f"{where}: the environment variable {UNIT_HMAC_KEY_ENV} is not set; set it to a secret of at least "
            f"{MIN_KEY_BYTES} bytes, the same on every worker (or remove privacy_unit_hash)"
        )
    key = secret.encode("utf-8", "surrogatepass")
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(
            f"{where}: the secret in {UNIT_HMAC_KEY_ENV} is shorter than {MIN_KEY_BYTES} bytes; use a longer "
            "random one (e.g. `openssl rand -hex 32`)"
        )
    return UnitHasher(key)


def check_unit_hashing(topology: Topology, environ: Mapping[str, str] | None = None) -> None:
    """Fail fast (one-line ConfigError) when a source hashes unit ids and the secret is not usable."""
    for source in topology.sources.values():
        unit_hasher(source, environ)


def hashed_copy(
    raw: bytes, parser: EventParser, hasher: UnitHasher, loads: Callable[[bytes], Any], dumps: Callable[[Any], bytes]
) -> tuple[bytes, bytes] | None:
    """The event re-encoded with its unit field replaced by the hash, and the hash as Kafka key; None when
    the event has no unit the parser would accept, or cannot be re-encoded (a field the parser never
    reads that `loads` refuses): the hop then dead-letters it (`refusal_reason`)."""
    try:
        unit = parser.unit(raw)
        obj = loads(raw)
    except (EventError, ValueError, TypeError):
        return None
    if unit is None or type(obj) is not dict:  # pragma: no cover - the parser refused those already
        return None
    obj[parser.source.privacy_unit] = hashed = hasher(unit)
    return dumps(obj), hashed.encode()


def refusal_reason(raw: bytes | None, parser: EventParser) -> str:
    """Why the hop refuses an event `hashed_copy` could not rewrite: the ingest's reason (not_json,
    not_object, missing_unit or bad_unit), or not_json when only its re-encoding failed. The hop
    dead-letters it itself, so its raw id stays out of the by-unit topic."""
    try:
        parser.unit(raw or b"")
    except EventError as exc:
        return exc.reason
    return "not_json"
