"""The Redis ledger backend (production): every write is one `.lua` script on one scope's hash slot.

Scripts are registered once per client (`register_script`: EVALSHA with a NOSCRIPT fallback).
Any Redis or socket failure raises `LedgerUnavailable` (fail closed); a script's own
`dpstream:` error reply is a bug and raises `InternalError`.
"""

from __future__ import annotations

__all__ = ["RedisLedger", "connect"]

from collections.abc import Awaitable, Sequence
from functools import lru_cache
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from dpstream.topology.errors import InternalError
from dpstream.workers.ledger.base import Ledger, RawCharge, RawRegister
from dpstream.workers.ledger.errors import LedgerUnavailable
from dpstream.workers.ledger.keys import SCOPES_INDEX, ScopeKeys
from dpstream.workers.ledger.scripts import SCRIPT_NAMES, script_text
from dpstream.workers.ledger.types import PendingRelease, ReleaseRequest

_T = TypeVar("_T")


def connect(url: str, max_connections: int = 128) -> aioredis.Redis[bytes]:
    """A redis.asyncio client with bounded pool, short timeouts and bytes replies (payloads stay exact)."""
    pool: aioredis.BlockingConnectionPool[aioredis.Connection] = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=10, socket_connect_timeout=2.0, socket_timeout=5.0
    )
    return aioredis.Redis(connection_pool=pool)


@lru_cache(maxsize=256)
def _keys(scope: str) -> ScopeKeys:
    return ScopeKeys(scope)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _hash(raw: dict[Any, Any]) -> dict[str, str]:
    return {_s(k): _s(v) for k, v in raw.items()}


class RedisLedger(Ledger):
    """The ledger in Redis."""

    backend = "redis"

    def __init__(self, client: aioredis.Redis[bytes], url: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client = client
        self._url = url
        self._scripts = {name: client.register_script(script_text(name)) for name in SCRIPT_NAMES}

    async def _guard(self, awaitable: Awaitable[_T]) -> _T:
        try:
            return await awaitable
        except ResponseError as exc:
            if "dpstream:" in str(exc):
                raise InternalError(f"ledger script failed (this is a bug): {exc}") from exc
            raise LedgerUnavailable(f"ledger Redis {self._url} refused the call: {exc}") from exc
        except (RedisError, OSError) as exc:
            raise LedgerUnavailable(f"ledger Redis {self._url} unavailable: {exc}") from exc

    async def server_settings(self) -> dict[str, str]:
        """`CONFIG GET appendonly / appendfsync` of the server (for the durability check)."""
        out: dict[str, str] = {}
        for name in ("appendonly", "appendfsync"):
            try:
                got = await self._guard(self._client.config_get(name))
            except LedgerUnavailable as exc:
                if "unavailable" in str(exc):
                    raise
                got = {}
            out.update(_hash(got))
        return out

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every script now, so no release pays the NOSCRIPT → load → retry round trips."""
        for name in SCRIPT_NAMES:
            await self._guard(self._client.script_load(script_text(name)))  # type: ignore[no-untyped-call]  # types-redis leaves script_load unannotated

    async def close(self) -> None:
        """Close the client and its pool."""
        await self._client.aclose()  # type: ignore[attr-defined]  # types-redis 4.6 predates aclose (redis >= 5.0.1)

    # ---- writes (scripts) ------------------------------------------------------------------

    async def _register(
        self, scope: str, fields: dict[str, str], actor: str, now_ms: int, pid: str, period_s: int
    ) -> RawRegister:
        k = ScopeKeys(scope)
        args: list[str] = [fields["digest"], actor, str(now_ms), str(period_s)]
        for name, value in fields.items():
            args += [name, value]
        out = await self._guard(self._scripts["register"](keys=[k.config, k.audit, k.period(pid)], args=args))
        code = int(out[0])
        if code == 2:
            return RawRegister(code, _s(out[1]), _s(out[2]), int(out[3]), int(out[4]))
        await self._guard(self._client.sadd(SCOPES_INDEX, scope))
        return RawRegister(code)

    async def _deployment_start(self, key: str, proposed: int) -> int:
        pipe = self._client.pipeline(transaction=True)  # MULTI: SET NX, GET (the first start wins)
        pipe.set(key, proposed, nx=True)
        pipe.get(key)
        out = await self._guard(pipe.execute())
        return int(out[1])

    async def _charge(
        self, req: ReleaseRequest, cost_units: int, delta_units: int, period_start: int, digest: str, now_ms: int
    ) -> RawCharge:
        k = _keys(req.scope)
        keys = [
            k.config,
            k.breaker,
            k.period(req.period_id),
            k.release(req.release_id),
            k.ends(req.period_id, req.metric),
            k.audit,
            k.pending,
            k.periods,
        ]
        fields = [
            req.release_id,
            req.period_id,
            str(period_start),
            req.metric,
            str(int(req.window_start)),
            str(int(req.window_end)),
            str(cost_units),
            "1" if req.may_use_reserve else "0",
            str(now_ms),
            str(self._retention_s),
            req.actor,
            digest,
            str(delta_units),
        ]
        for pid, pstart in req.extra_periods:
            keys += [k.period(pid), k.ends(pid, req.metric)]
            fields += [pid, str(int(pstart))]
        header = "\n".join(fields)
        quoted = "" if req.quoted_version is None else str(req.quoted_version)
        out = await self._guard(self._scripts["charge"](keys=keys, args=[header, bytes(req.payload), quoted]))
        outcome, spent, cap, state, charged, rest = bytes(out).split(b"\n", 5)
        if outcome == b"stale_quote":
            reason = f"stale quote: the period's spend version is now {rest.decode()}"
            return RawCharge("stale_quote", b"", reason, int(spent), int(cap), state.decode(), 0)
        reason = rest.decode() if outcome == b"refused" else ""
        payload = b"" if outcome == b"refused" else rest
        return RawCharge(outcome.decode(), payload, reason, int(spent), int(cap), state.decode(), int(charged))

    async def _commit(self, scope: str, release_id: str, now_ms: int) -> int:
        k = ScopeKeys(scope)
        return int(
            await self._guard(
                self._scripts["commit"](keys=[k.release(release_id), k.pending], args=[release_id, now_ms])
            )
        )

    async def _breaker(self, scope: str, action: str, reason: str, actor: str, pid: str, now_ms: int) -> bool:
        k = ScopeKeys(scope)
        out = await self._guard(
            self._scripts["breaker"](keys=[k.breaker, k.audit], args=[action, reason, actor, now_ms, pid])
        )
        return int(out[0]) == 1

    async def _grant(self, scope: str, pid: str, pstart: int, units: int, reason: str, actor: str, now_ms: int) -> int:
        k = ScopeKeys(scope)
        keys = [k.period(pid), k.breaker, k.audit, k.config, k.periods]
        return int(
            await self._guard(self._scripts["grant"](keys=keys, args=[units, reason, actor, now_ms, pid, pstart]))
        )

    # ---- reads ---------------------------------------------------------------------------------

    async def _snapshot(
        self, scope: str, pid: str, metrics: Sequence[str], window_end: int
    ) -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, int]]:
        k = ScopeKeys(scope)
        pipe = self._client.pipeline(transaction=True)
        pipe.hgetall(k.config)
        pipe.hgetall(k.breaker)
        pipe.hgetall(k.period(pid))
        for m in metrics:
            pipe.zcount(k.ends(pid, m), window_end, "+inf")
        out = await self._guard(pipe.execute())
        counts = {m: int(c) for m, c in zip(metrics, out[3:], strict=True)}
        return _hash(out[0]), _hash(out[1]), _hash(out[2]), counts

    async def _stored_payload(self, scope: str, release_id: str) -> bytes | None:
        raw = await self._guard(self._client.hget(ScopeKeys(scope).release(release_id), "payload"))
        return bytes(raw) if raw is not None else None

    async def _pending(self, scope: str, before_ms: int) -> list[PendingRelease]:
        k = ScopeKeys(scope)
        rows = await self._guard(self._client.zrangebyscore(k.pending, "-inf", before_ms, withscores=True))
        out = []
        for rid_b, score in rows:
            rid = _s(rid_b)
            r = await self._guard(self._client.hgetall(k.release(rid)))
            if not r:
                continue  # expired past retention
            f = {_s(a): b for a, b in r.items()}
            out.append(
                PendingRelease(
                    rid,
                    scope,
                    _s(f["period"]),
                    _s(f["metric"]),
                    int(f["window_start"]),
                    int(f["window_end"]),
                    int(f["cost"]),
                    int(score),
                    bytes(f["payload"]),
                )
            )
        return out

    async def _config_fields(self, scope: str) -> dict[str, str]:
        return _hash(await self._guard(self._client.hgetall(ScopeKeys(scope).config)))

    async def _breaker_fields(self, scope: str) -> dict[str, str]:
        return _hash(await self._guard(self._client.hgetall(ScopeKeys(scope).breaker)))

    async def _period_fields(self, scope: str, pid: str) -> dict[str, str]:
        return _hash(await self._guard(self._client.hgetall(ScopeKeys(scope).period(pid))))

    async def _period_ids(self, scope: str, limit: int | None) -> list[tuple[str, int]]:
        end = -1 if limit is None else limit - 1
        rows = await self._guard(self._client.zrevrange(ScopeKeys(scope).periods, 0, end, withscores=True))
        return [(_s(pid), int(score)) for pid, score in rows]

    async def _audit(self, scope: str, since_ms: int, limit: int | None) -> list[tuple[str, dict[str, str]]]:
        rows = await self._guard(self._client.xrange(ScopeKeys(scope).audit, f"{since_ms}-0", "+", count=limit))
        return [(_s(i), _hash(f)) for i, f in rows]

    async def _scopes(self) -> list[str]:
        return sorted(_s(s) for s in await self._guard(self._client.smembers(SCOPES_INDEX)))
