"""The Redis ledger backend (production): every write is one `.lua` script on one scope's hash slot.

Scripts are registered once per client (`register_script`: EVALSHA with a NOSCRIPT fallback).
Any Redis or socket failure raises `LedgerUnavailable` (fail closed); a script's own
`dpstream:` error reply is a bug and raises `InternalError`.

With replicas (a Sentinel URL, or a primary that reports replicas), nothing this ledger hands out
for publishing is acknowledged until `WAIT` confirms it on `min_replicas` replicas: a charged or
duplicate `charge`, a `stored_payload` found, and every `pending` release. Each of those first
writes the scope's fence key and then WAITs on the same connection; the replication stream is
ordered, so the WAIT covers every earlier write of the scope, whichever client made it. Fewer
confirmations raise `LedgerUnavailable`: the caller publishes nothing and retries later, and the
retry finds the stored bytes (and WAITs again) or, if a failover lost the charge, charges afresh.

A charge is decided in Python (`decision.decide`) and applied by `lua/apply.lua`, which writes
only if the scope's `seq` and `writer` are still those the decision read, and checks the
invariants by itself. Each scope's charges go through one flusher per process (group commit):
it decides the queued charges one after another on its cached view of the scope, as each leaves
it, and sends them in one pipeline, so a process needs no read per charge and many charges share a
round trip. Another process's write moves `seq`: the charges from there on are stale, and are
decided again on a fresh read.
"""

from __future__ import annotations

__all__ = ["RedisLedger", "connect"]

import asyncio
import itertools
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoPermissionError, NoScriptError, RedisError, ResponseError

from dpstream.topology.errors import ConfigError, InternalError
from dpstream.workers.ledger.base import Ledger, RawCharge
from dpstream.workers.ledger.connection import LedgerAddress, SentinelPool, connect
from dpstream.workers.ledger.decision import Charge, Decision, View, decide, neighbours, writes
from dpstream.workers.ledger.durability import check_durability, replica_problem
from dpstream.workers.ledger.errors import LedgerUnavailable
from dpstream.workers.ledger.keys import SCOPES_INDEX, ScopeKeys, in_namespace
from dpstream.workers.ledger.scripts import SCRIPT_NAMES, script_sha, script_text
from dpstream.workers.ledger.state import Key, Op, ScopeState, apply_ops
from dpstream.workers.ledger.types import ChargeResult, Outcome, PendingRelease, ReleaseRequest, StoredCharge

_T = TypeVar("_T")
_A = TypeVar("_A")


def _packed_str(raw: bytes) -> msgspec.Raw:
    """`raw` as a MessagePack str, byte for byte (Redis's cmsgpack reads no bin type, which msgspec
    gives bytes; a str holds any bytes there)."""
    n = len(raw)
    if n < 32:
        head = bytes((0xA0 | n,))
    elif n < 1 << 8:
        head = b"\xd9" + n.to_bytes(1, "big")
    elif n < 1 << 16:
        head = b"\xda" + n.to_bytes(2, "big")
    else:
        head = b"\xdb" + n.to_bytes(4, "big")
    return msgspec.Raw(head + raw)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _hash(raw: dict[Any, Any]) -> dict[str, str]:
    return {_s(k): _s(v) for k, v in raw.items()}


def _flat_hash(raw: list[Any]) -> dict[str, str]:
    """A hash as a script returns it (HGETALL's field, value, ... list) as `_hash` gives it."""
    pairs = iter(raw)
    return _hash(dict(zip(pairs, pairs, strict=True)))


_ATTEMPTS = 50
"""Fresh reads a batch of charges gets while other processes keep writing its scope."""
_TURN_AFTER = 2
"""Stale attempts in a row after which a process asks for the scope's turn (apply.lua)."""
_TURN_MS = 100
"""How long a turn lasts at most (its holder's first write ends it sooner)."""
_VIEW_BLOCKS = 16
"""Period blocks a cached view holds before it is read afresh (with only the blocks in use)."""


@dataclass
class _CachedView:
    """A scope as this process last read or wrote it, and the `seq`/`writer` it stood at then."""

    state: ScopeState
    seq: str
    writer: str


def _blocks_read(state: ScopeState, batch: Sequence[tuple[Charge, object]]) -> list[str]:
    """The period blocks deciding the batch reads: each charge's periods, and for a block not
    opened yet the neighbours it could overlap."""
    out = []
    for charge, _ in batch:
        req = charge.req
        for pid, start in ((req.period_id, charge.period_start), *req.extra_periods):
            out.append(pid)
            if pid not in state.period_index:
                out += [b for _, b in filter(None, neighbours(state.period_index, int(start), charge.terms.period_s))]
    return out


def _key_name(k: ScopeKeys, key: Key) -> str:
    """The Redis name of a scope's key by role (`state.Key`)."""
    role = key[0]
    if role == "period":
        return k.period(key[1])
    if role == "ends":
        return k.ends(key[1], key[2])
    if role == "release":
        return k.release(key[1])
    if role == "running":
        return k.running(key[1], key[2])
    return str(getattr(k, role))


class RedisLedger(Ledger):
    """The ledger in Redis."""

    backend = "redis"

    def __init__(self, client: aioredis.Redis[bytes], url: str | LedgerAddress, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client = client
        self._address = url if isinstance(url, LedgerAddress) else LedgerAddress.parse(url)
        self._url = self._address.display  # the only form of the URL that reaches a message
        self._namespace = self._address.namespace
        self._scopes_index = in_namespace(SCOPES_INDEX, self._namespace)
        self._scope_keys: dict[str, ScopeKeys] = {}
        self._cluster: bool = isinstance(client, RedisCluster)
        self.min_replicas = self._address.min_replicas or 0
        """Replicas a WAIT must confirm before a charge is acknowledged (settled by `check_durability`)."""
        self._scripts = {name: client.register_script(script_text(name)) for name in SCRIPT_NAMES}
        self._queued: dict[str, list[tuple[Charge, asyncio.Future[RawCharge]]]] = {}
        self._flushers: dict[str, asyncio.Task[None]] = {}
        self._views: dict[str, _CachedView] = {}
        self._writer_prefix = os.urandom(6).hex()
        self._writers = itertools.count()

    def _keys(self, scope: str) -> ScopeKeys:
        """The keys of `scope` in this ledger's namespace (kept: a worker names a few scopes)."""
        keys = self._scope_keys.get(scope)
        if keys is None:
            keys = ScopeKeys(scope, self._namespace)
            if len(self._scope_keys) < 256:
                self._scope_keys[scope] = keys
        return keys

    async def _guard(self, awaitable: Awaitable[_T]) -> _T:
        try:
            return await awaitable
        except NoPermissionError as exc:  # before the script check: its message may name a dpstream: key
            raise LedgerUnavailable(
                f"ledger Redis {self._url} refused the call: {exc}: the ledger's ACL user needs the commands "
                "in LEDGER_ACL_COMMANDS (workers/ledger/connection.py) on keys ~dpstream:*"
            ) from exc
        except NoScriptError:
            raise  # only a batch's bare EVALSHA meets it: `_apply_chunk` loads the scripts and retries
        except ResponseError as exc:
            if "dpstream:" in str(exc):
                raise InternalError(f"ledger script failed (this is a bug): {exc}") from exc
            raise LedgerUnavailable(f"ledger Redis {self._url} refused the call: {exc}") from exc
        except (RedisError, OSError) as exc:
            raise LedgerUnavailable(f"ledger Redis {self._url} unavailable: {exc}") from exc

    async def server_settings(self, node: tuple[str, int] | None = None) -> dict[str, str]:
        """`CONFIG GET appendonly / appendfsync` of the server, or of another `node` (a replica, a Cluster
        node), for the durability check; a setting the server itself refuses to show reads as unset."""
        client = self._client if node is None else self._address.node_client(*node)
        out: dict[str, str] = {}
        try:
            for name in ("appendonly", "appendfsync"):
                try:
                    out.update(_hash(await self._guard(client.config_get(name))))
                except LedgerUnavailable as exc:
                    if node is not None or "unavailable" in str(exc):
                        raise
        finally:
            if node is not None:
                await client.aclose()  # type: ignore[attr-defined]  # types-redis 4.6 predates aclose
        return out

    async def replicas(self) -> list[tuple[str, int]]:
        """(host, port) of the replicas the primary reports connected (`INFO replication`)."""
        info = await self._guard(self._client.info("replication"))
        out = []
        for name, value in info.items():
            if str(name).startswith("slave") and isinstance(value, dict) and "ip" in value:
                out.append((str(value["ip"]), int(value["port"])))
        return sorted(out)

    async def check_durability(self, allow_volatile: bool) -> None:
        """Refuse a primary or replica that could lose an acknowledged charge (ConfigError unless
        `allow_volatile`), and settle `min_replicas`: the URL's, else 1 under Sentinel or when the
        primary reports a replica, else 0. A replica is promoted by a failover, so its AOF counts too."""
        if self._cluster:
            await self._check_cluster(allow_volatile)
            return
        check_durability(self._url, await self.server_settings(), allow_volatile)
        replicas = await self.replicas()
        for host, port in replicas:
            got = await self.server_settings((host, port))
            check_durability(f"{self._url} (replica {host}:{port})", got, allow_volatile)
        if self._address.min_replicas is None:
            self.min_replicas = 1 if self._address.sentinel or replicas else 0
        problem = replica_problem(self.min_replicas, len(replicas))
        if problem is not None:
            print(f"dpstream: WARNING: ledger {self._url}: {problem}", file=sys.stderr)

    async def _check_cluster(self, allow_volatile: bool) -> None:
        """Every node of a Redis Cluster durable; no WAIT (it confirms one node's replicas, and a
        pipeline cannot pin it to the scope's node), so `min_replicas` above 0 is refused."""
        if (self._address.min_replicas or 0) > 0:
            raise ConfigError(
                f"redis {self._url}: min_replicas={self._address.min_replicas}: the ledger cannot WAIT on a "
                "Redis Cluster: use Sentinel for replicated charges, or min_replicas=0"
            )
        await self._guard(self._client.ping())  # the client learns the cluster's nodes
        cluster = cast("RedisCluster[bytes]", self._client)
        for node in cluster.get_nodes():
            got = await self.server_settings((str(node.host), int(node.port)))
            check_durability(f"{self._url} (node {node.host}:{node.port})", got, allow_volatile)
        self.min_replicas = 0

    async def _replicated(self, scope: str) -> None:
        """Return once everything written so far to `scope`'s primary is on `min_replicas` replicas,
        else raise LedgerUnavailable (nothing may be published on an unconfirmed charge)."""
        if self.min_replicas <= 0:
            return
        pipe = self._client.pipeline(transaction=False)  # one connection: the WAIT covers its INCR
        pipe.incr(self._keys(scope).fence)
        pipe.wait(self.min_replicas, self._address.wait_timeout_ms)
        out = await self._guard(pipe.execute())
        confirmed = int(out[1])
        if confirmed < self.min_replicas:
            raise LedgerUnavailable(
                f"ledger Redis {self._url}: {confirmed} of the {self.min_replicas} replicas required confirmed "
                f"the write within {self._address.wait_timeout_ms} ms: not acknowledged, nothing published "
                "(retried later with the stored bytes)"
            )

    async def charge(self, req: ReleaseRequest) -> ChargeResult:
        """The base charge, acknowledged only once replicated (a refusal publishes nothing: no WAIT)."""
        result = await super().charge(req)
        if result.outcome in (Outcome.CHARGED, Outcome.DUPLICATE):
            await self._replicated(req.scope)
        return result

    async def stored_payload(self, scope: str, release_id: str) -> bytes | None:
        """The stored payload, returned only once it is on `min_replicas` replicas (it will be published)."""
        payload = await super().stored_payload(scope, release_id)
        if payload is not None:
            await self._replicated(scope)
        return payload

    async def pending(self, older_than_s: float) -> list[PendingRelease]:
        """The sweeper's pending releases, returned only once each scope's writes are replicated."""
        rows = await super().pending(older_than_s)
        for scope in sorted({p.scope for p in rows}):
            await self._replicated(scope)
        return rows

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every script now, so no release pays the NOSCRIPT → load → retry round trips."""
        for name in SCRIPT_NAMES:
            await self._guard(self._client.script_load(script_text(name)))  # type: ignore[no-untyped-call]  # types-redis leaves script_load unannotated

    async def close(self) -> None:
        """Close the client and its pool (and, under Sentinel, the connections to the sentinels)."""
        for flusher in list(self._flushers.values()):
            flusher.cancel()
        pool = None if self._cluster else self._client.connection_pool
        await self._client.aclose()  # type: ignore[attr-defined]  # types-redis 4.6 predates aclose (redis >= 5.0.1)
        if isinstance(pool, SentinelPool):
            await pool.aclose_sentinels()

    # ---- writes (scripts) ------------------------------------------------------------------

    async def _index_scope(self, scope: str) -> None:
        await self._guard(self._client.sadd(self._scopes_index, scope))

    async def _set_nx(self, key: str, proposed: str) -> str | None:
        key = in_namespace(key, self._namespace)
        pipe = self._client.pipeline(transaction=True)  # MULTI: SET NX, GET (the first value wins, forever)
        pipe.set(key, proposed, nx=True)
        pipe.get(key)
        out = await self._guard(pipe.execute())
        return _s(out[1])

    async def _get(self, key: str) -> str | None:
        raw = await self._guard(self._client.get(in_namespace(key, self._namespace)))
        return None if raw is None else _s(raw)

    async def _charge(self, charge: Charge) -> RawCharge:
        """Queue the charge for its scope's flusher, which decides the queued charges on its cached
        view and applies them in one pipeline (group commit): one round trip for many charges."""
        req = charge.req
        answer: asyncio.Future[RawCharge] = asyncio.get_running_loop().create_future()
        self._queued.setdefault(req.scope, []).append((charge, answer))
        if req.scope not in self._flushers:
            self._flushers[req.scope] = asyncio.create_task(self._flush(req.scope))
        return await answer

    async def _flush(self, scope: str) -> None:
        """Apply the scope's queued charges, batch after batch, until none is queued."""
        try:
            while batch := self._queued.pop(scope, None):
                try:
                    await self._apply_batch(scope, batch)
                except BaseException as exc:
                    for _, answer in batch:
                        if answer.done():
                            continue
                        if isinstance(exc, asyncio.CancelledError):
                            answer.cancel()
                        else:
                            answer.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
        finally:
            self._flushers.pop(scope, None)

    async def _apply_batch(self, scope: str, batch: list[tuple[Charge, asyncio.Future[RawCharge]]]) -> None:
        """Decide each charge on the view as the ones before it leave it, and apply them all in
        one pipeline; a charge whose scope moved (another process wrote) is decided again on a
        fresh read, with every charge after it (each was decided on the ones before)."""
        stale, contended = 0, False
        while batch:
            if stale >= _ATTEMPTS:
                raise LedgerUnavailable(
                    f"ledger Redis {self._url}: scope {scope!r} moved under each of {_ATTEMPTS} attempts to "
                    "charge it in a row (other processes charging it all the while): nothing charged, retried later"
                )
            # once contended, one charge at a time: the shortest window between the read and the write
            chunk, batch = (batch[:1], batch[1:]) if contended else (batch, [])
            retry = await self._apply_chunk(scope, chunk)
            stale = stale + 1 if retry else 0
            if retry:
                contended = True
                self._views.pop(scope, None)
                batch = retry + batch
                if stale >= _TURN_AFTER:  # others' writes keep this process's charges stale: take a turn
                    await self._guard(
                        self._client.set(self._keys(scope).turn, self._writer_prefix, nx=True, px=_TURN_MS)
                    )
                    await asyncio.sleep(0.0005)

    async def _apply_chunk(
        self, scope: str, chunk: list[tuple[Charge, asyncio.Future[RawCharge]]]
    ) -> list[tuple[Charge, asyncio.Future[RawCharge]]]:
        """Decide and apply `chunk` in one pipeline; the charges found stale (to decide again)."""
        view = await self._view(scope, chunk)
        pipe = self._client.pipeline(transaction=False)
        apply_sha = script_sha("apply")
        steps = []
        for charge, answer in chunk:
            state = view.state
            decided_on = View(state.config, state.breaker, state.periods, state.period_index, None)
            decision = decide(decided_on, charge)
            ops = writes(charge, decision, self._retention_s)
            writer = f"{self._writer_prefix}.{next(self._writers)}"
            keys, args = self._encode(scope, charge, decision, ops, view.seq, view.writer, writer)
            # queued as a bare EVALSHA: a script object would make the pipeline ask SCRIPT EXISTS
            # first, one more round trip per batch, and a worker's release is a batch of one
            # (serial releases on Redis: client CPU 1.96–2.31 → 1.82–2.03 ms a release)
            pipe.evalsha(apply_sha, len(keys), *keys, *args)
            steps.append((charge, answer, decision, decided_on))
            if ops:
                apply_ops(view.state, ops, str, view_only=True)
                view.seq, view.writer = str(int(view.seq) + 1), writer
        try:
            replies = await self._guard(pipe.execute())
        except NoScriptError:
            await self.load_scripts()  # a restarted or failed-over Redis: the scripts are gone, nothing ran
            self._views.pop(scope, None)
            return chunk
        retry = []
        for (charge, answer, decision, decided_on), reply in zip(steps, replies, strict=True):
            kind = _s(reply[0])
            if kind == "stale":
                retry.append((charge, answer))
                continue
            if kind == "duplicate":
                decision = decide(decided_on._replace(known=bytes(reply[1])), charge)
                self._views.pop(scope, None)  # it wrote nothing: the view ran ahead
            if not answer.done():
                answer.set_result(decision.answer)
        return retry

    async def _view(self, scope: str, batch: list[tuple[Charge, asyncio.Future[RawCharge]]]) -> _CachedView:
        """The scope's view as this process last read or wrote it, read afresh when it lacks a
        block the batch's charges read."""
        view = self._views.get(scope)
        if (
            view is not None
            and len(view.state.periods) <= _VIEW_BLOCKS
            and all(pid in view.state.periods for pid in _blocks_read(view.state, batch))
        ):
            return view
        pids = sorted({c.req.period_id for c, _ in batch} | {pid for c, _ in batch for pid, _ in c.req.extra_periods})
        view = await self._read_view(scope, pids)
        more = sorted(set(_blocks_read(view.state, batch)) - set(view.state.periods))
        if more:  # a new block's neighbours (a later write shows in seq, which apply.lua checks)
            pipe = self._client.pipeline(transaction=True)
            for pid in more:
                pipe.hgetall(self._keys(scope).period(pid))
            view.state.periods.update(zip(more, map(_hash, await self._guard(pipe.execute())), strict=True))
        if not view.state.config:
            raise InternalError(f"charge: scope not registered ({scope})")
        self._views[scope] = view
        return view

    async def _read_view(self, scope: str, pids: Sequence[str], *, parked: bool = False) -> _CachedView:
        """The scope's config, breaker, period index and blocks `pids` (and its parked windows), in one MULTI."""
        k = self._keys(scope)
        pipe = self._client.pipeline(transaction=True)
        pipe.hgetall(k.config)
        pipe.hgetall(k.breaker)
        pipe.zrange(k.periods, 0, -1, withscores=True)
        for pid in pids:
            pipe.hgetall(k.period(pid))
        if parked:
            pipe.hgetall(k.parked)
        out = await self._guard(pipe.execute())
        config = _hash(out[0])
        state = ScopeState(config=config, breaker=_hash(out[1]), parked=_hash(out.pop()) if parked else {})
        state.period_index = {_s(member): int(score) for member, score in out[2]}
        state.periods = {pid: _hash(fields) for pid, fields in zip(pids, out[3:], strict=True)}
        return _CachedView(state, config.get("seq", "0"), config.get("writer", ""))

    def _encode(
        self, scope: str, charge: Charge, decision: Decision, ops: Sequence[Op], seq: str, writer: str, new_writer: str
    ) -> tuple[list[str], list[str | bytes]]:
        """apply.lua's KEYS and ARGV for one decided charge (see its header)."""
        k, req, terms = self._keys(scope), charge.req, charge.terms
        keys = [k.config, k.release(req.release_id), k.turn]
        index: dict[Key, int] = {("config",): 1, ("release", req.release_id): 2}
        args: list[str | bytes] = [seq, writer, new_writer, str(len(decision.charged))]
        for pid, units, _ in decision.charged:
            block = self._key_index(k, ("period", pid), keys, index)
            args += [block, str(units), str(charge.delta), terms.accounting, str(terms.cap_units)]
            m = -charge.max_windows if req.needs_lump else charge.max_windows  # (apply.lua: -m, lump first)
            args += [str(terms.period_s), str(m), charge.top_field, str(charge.cost)]
        self._encode_ops(k, ops, keys, index, args)
        return keys, args

    @staticmethod
    def _key_index(k: ScopeKeys, key: Key, keys: list[str], index: dict[Key, int]) -> str:
        """`key`'s index in apply.lua's KEYS (appended on first use)."""
        i = index.get(key)
        if i is None:
            keys.append(_key_name(k, key))
            i = index[key] = len(keys)
        return str(i)

    def _encode_ops(
        self, k: ScopeKeys, ops: Sequence[Op], keys: list[str], index: dict[Key, int], args: list[str | bytes]
    ) -> None:
        """Append apply.lua's ops argument for `ops` to `args` (their keys to `keys`): one MessagePack
        array of [command, key index, [values as str or bytes]]."""
        if ops:
            args.append(
                msgspec.msgpack.encode(
                    [
                        [
                            command,
                            int(self._key_index(k, key, keys, index)),
                            [_packed_str(v) if isinstance(v, bytes) else str(v) for v in values],
                        ]
                        for command, key, values in ops
                    ]
                )
            )

    async def _commit(self, scope: str, release_id: str, now_ms: int) -> int:
        k = self._keys(scope)
        return int(
            await self._guard(
                self._scripts["commit"](keys=[k.release(release_id), k.pending], args=[release_id, now_ms])
            )
        )

    async def _step(
        self,
        scope: str,
        pids: Sequence[str],
        decide: Callable[[ScopeState], tuple[_A, Sequence[Op]]],
        *,
        parked: bool = False,
    ) -> _A:
        k = self._keys(scope)
        for _ in range(_ATTEMPTS):
            view = await self._read_view(scope, sorted(pids), parked=parked)
            answer, ops = decide(view.state)
            if not ops:
                return answer
            args: list[str | bytes] = [view.seq, view.writer, f"{self._writer_prefix}.{next(self._writers)}", "0"]
            keys = [k.config, k.config, k.turn]  # (the config as the release: this step charges none)
            self._encode_ops(k, ops, keys, {}, args)
            reply = await self._guard(self._scripts["apply"](keys=keys, args=args))
            self._views.pop(scope, None)
            if _s(reply[0]) == "ok":
                return answer
        raise LedgerUnavailable(
            f"ledger Redis {self._url}: scope {scope!r} moved under each of {_ATTEMPTS} attempts to change it: "
            "nothing written, try again"
        )

    # ---- reads ---------------------------------------------------------------------------------

    async def _snapshot(
        self, scope: str, pid: str, metrics: Sequence[str], window_end: int
    ) -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, int], dict[str, int], dict[str, int]]:
        k = self._keys(scope)
        keys = [k.config, k.breaker, k.period(pid), *(k.ends(pid, m) for m in metrics)]
        config, breaker, period, c = await self._guard(self._scripts["quote"](keys=keys, args=[window_end]))
        counts = {m: int(n) for m, n in zip(metrics, c[0::3], strict=True)}
        before = {m: int(n) for m, n in zip(metrics, c[1::3], strict=True)}
        at = {m: int(n) for m, n in zip(metrics, c[2::3], strict=True)}
        return _flat_hash(config), _flat_hash(breaker), _flat_hash(period), counts, before, at

    async def _charged_ends(
        self, scope: str, pid: str, metrics: Sequence[str], since: int | None
    ) -> tuple[int, dict[str, dict[str, int]]]:
        k = self._keys(scope)
        pipe = self._client.pipeline(transaction=True)
        pipe.hget(k.period(pid), "version")
        for m in metrics:
            pipe.zrangebyscore(k.ends(pid, m), "-inf" if since is None else since, "+inf", withscores=True)
        out = await self._guard(pipe.execute())
        ends = {m: {_s(rid): int(end) for rid, end in pairs} for m, pairs in zip(metrics, out[1:], strict=True)}
        return int(_s(out[0]) if out[0] is not None else 0), ends

    async def _stored_charges(self, scope: str, release_ids: Sequence[str]) -> dict[str, StoredCharge]:
        k = self._keys(scope)
        pipe = self._client.pipeline(transaction=False)
        for rid in release_ids:
            pipe.hmget(k.release(rid), ["payload", "cost"])
        out = await self._guard(pipe.execute())
        return {
            rid: StoredCharge(bytes(raw), int(paid or 0))
            for rid, (raw, paid) in zip(release_ids, out, strict=True)
            if raw is not None
        }

    async def _read(
        self,
        scope: str,
        read: Callable[[ScopeState], _A],
        pids: Sequence[str] = (),
        *,
        periods: int = 0,
        since_ms: int | None = None,
        before_ms: int | None = None,
        limit: int | None = None,
        running: tuple[str, str] | None = None,
    ) -> _A:
        k = self._keys(scope)
        pipe = self._client.pipeline(transaction=True)
        for key in (k.config, k.breaker, k.parked, *map(k.period, pids)):
            pipe.hgetall(key)
        if periods:
            pipe.zrevrange(k.periods, 0, periods - 1 if periods > 0 else -1, withscores=True)
        if since_ms is not None:
            pipe.xrange(k.audit, f"{since_ms}-0", "+", count=limit)
        if before_ms is not None:
            pipe.zrangebyscore(k.pending, "-inf", before_ms, withscores=True)
        if running is not None:
            pipe.hgetall(k.running(*running))
        out = iter(await self._guard(pipe.execute()))
        state = ScopeState(config=_hash(next(out)), breaker=_hash(next(out)), parked=_hash(next(out)))
        state.periods = {pid: _hash(next(out)) for pid in pids}
        if periods:
            state.period_index = {_s(pid): int(start) for pid, start in next(out)}
        if since_ms is not None:
            state.audit = [(_s(i), _hash(f)) for i, f in next(out)]
        pending = [(_s(rid), int(at)) for rid, at in next(out)] if before_ms is not None else None
        if running is not None:
            state.running[running] = {_s(a): bytes(b) for a, b in next(out).items()}
        if pending is not None:
            state.pending = dict(pending)
            pipe = self._client.pipeline(transaction=False)
            for rid in state.pending:
                pipe.hgetall(k.release(rid))
            for rid, r in zip(state.pending, await self._guard(pipe.execute()), strict=True):
                state.releases[rid] = {_s(a): bytes(b) if a == b"payload" else _s(b) for a, b in r.items()}
        return read(state)

    async def _scopes(self) -> list[str]:
        return sorted(_s(s) for s in await self._guard(self._client.smembers(self._scopes_index)))
