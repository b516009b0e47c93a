"""Where the ledger's Redis is and how to reach it: one URL, parsed once, never printed with its secrets.

    redis://[user:pass@]host:port/db                   one server (AOF), as before
    rediss://user@host:port/db                         the same over TLS
    redis+sentinel://h1:p1,h2:p2/master-name[/db]      a primary with replicas under Redis Sentinel
    rediss+sentinel://…                                Sentinel, every connection over TLS
    redis+cluster://h1:p1[,h2:p2]                      Redis Cluster (rediss+cluster:// for TLS); db 0 only

Query parameters (all optional, also taken from the environment):
`min_replicas=N` (DPSTREAM_REDIS_MIN_REPLICAS): replicas a `WAIT` must confirm before a charge
counts as acknowledged (default: 1 under Sentinel or when the primary reports a replica, else 0);
`wait_timeout_ms=N` (DPSTREAM_REDIS_WAIT_TIMEOUT_MS, default 2000); `namespace=NAME`
(DPSTREAM_LEDGER_NAMESPACE): a key prefix so deployments can share one Redis;
`ssl_ca_certs=FILE` (DPSTREAM_REDIS_CA_FILE), `ssl_certfile`/`ssl_keyfile` (DPSTREAM_REDIS_CERT_FILE,
DPSTREAM_REDIS_KEY_FILE) for TLS. Credentials: the URL's, else DPSTREAM_REDIS_USERNAME and
DPSTREAM_REDIS_PASSWORD (Sentinel's own: DPSTREAM_SENTINEL_USERNAME / DPSTREAM_SENTINEL_PASSWORD).
Only `LedgerAddress.display` (no password, no query) goes into messages.
"""

from __future__ import annotations

__all__ = ["LEDGER_ACL_COMMANDS", "LedgerAddress", "SentinelPool", "connect", "redact"]

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from dpstream.topology.errors import ConfigError
from dpstream.workers.ledger.keys import check_namespace

DIRECT_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
DEFAULT_WAIT_TIMEOUT_MS = 2000
_OURS = ("min_replicas", "wait_timeout_ms", "namespace")
_TLS_FILES = {"ssl_ca_certs": "CA_FILE", "ssl_certfile": "CERT_FILE", "ssl_keyfile": "KEY_FILE"}
_SECRET_QUERY = re.compile(r"(password|secret|token|key)", re.IGNORECASE)
_TIMEOUTS = {"socket_connect_timeout": 2.0, "socket_timeout": 5.0}

LEDGER_ACL_COMMANDS = (
    # connection set-up (redis-py: AUTH; SELECT for a db other than 0; its CLIENT SETINFO may be refused)
    "+auth +hello +ping +select "
    # scripts (EVALSHA; SCRIPT LOAD at start and after a NOSCRIPT reply) and what they call
    "+evalsha +script|load +hset +hget +hmget +hincrby +hdel +xadd +zadd +zscore +zrem "
    "+expire +del "
    # reads, the scope index, the schedule start (MULTI SET NX / GET), the WAIT fence (redis-py's
    # incr() sends INCRBY)
    "+hgetall +zcount +zrange +zrangebyscore +zrevrange +xrange +sadd +smembers "
    "+set +get +multi +exec +discard "
    "+incr +incrby +wait "
    # the durability check and replica discovery at start
    "+config|get +info"
)
"""The ACL command rules of a dedicated ledger user: exactly what the ledger sends, nothing else.
Keys: `~dpstream:*`. Example: `ACL SETUSER ledger on >PASSWORD resetchannels ~dpstream:* -@all <these>`."""


def redact(url: str) -> str:
    """`url` without its password and query (safe for errors and logs); never raises."""
    try:
        parts = urlsplit(url)
        hosts = parts.netloc.rsplit("@", 1)[-1]
        user = unquote(parts.netloc.rsplit("@", 1)[0].split(":", 1)[0]) if "@" in parts.netloc else ""
        shown = f"{user}:***@{hosts}" if user or "@" in parts.netloc else hosts
        return urlunsplit((parts.scheme, shown, parts.path, "", ""))
    except ValueError:
        return "(unparseable redis URL)"


def _int(value: str, name: str, shown: str, low: int) -> int:
    try:
        out = int(value)
    except ValueError:
        out = low - 1
    if out < low:
        raise ConfigError(f"redis {shown}: {name}={value!r}: must be a whole number >= {low}")
    return out


@dataclass(frozen=True)
class LedgerAddress:
    """A parsed ledger URL plus the env settings it names; `display` is the only printable form."""

    scheme: str
    display: str
    direct_url: str = field(default="", repr=False)
    """The redis-py URL of a single server (our own query parameters removed); may hold a password."""
    sentinels: tuple[tuple[str, int], ...] = ()
    """(host, port) of the sentinels, or of the Cluster's seed nodes."""
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    tls_files: tuple[tuple[str, str], ...] = ()
    min_replicas: int | None = None
    wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS
    namespace: str = ""

    @property
    def sentinel(self) -> bool:
        """True for a primary with replicas found through Sentinel."""
        return self.scheme in SENTINEL_SCHEMES

    @property
    def cluster(self) -> bool:
        """True for a Redis Cluster (keys routed by the scope hash tag)."""
        return self.scheme in CLUSTER_SCHEMES

    @property
    def tls(self) -> bool:
        """True when every connection is TLS."""
        return self.scheme.startswith("rediss")

    @classmethod
    def parse(cls, url: str, env: Mapping[str, str] | None = None) -> LedgerAddress:
        """Parse `url` (see the module docstring); ConfigError, one line, without secrets, when it is wrong."""
        env = os.environ if env is None else env
        shown = redact(url)
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise ConfigError(f"redis {shown}: not a URL ({exc})") from None
        scheme = parts.scheme.lower()
        if scheme not in DIRECT_SCHEMES + SENTINEL_SCHEMES + CLUSTER_SCHEMES:
            raise ConfigError(
                f"redis {shown}: scheme {scheme or '(none)'!r}: use redis://, rediss://, unix://, "
                "redis+sentinel://, rediss+sentinel://, redis+cluster:// or rediss+cluster://"
            )
        query = parse_qsl(parts.query, keep_blank_values=True)
        ours = {k: v for k, v in query if k in _OURS}
        rest = [(k, v) for k, v in query if k not in _OURS and k not in _TLS_FILES]
        tls = dict((k, v) for k, v in query if k in _TLS_FILES)
        for name, suffix in _TLS_FILES.items():
            if name not in tls and env.get(f"DPSTREAM_REDIS_{suffix}"):
                tls[name] = env[f"DPSTREAM_REDIS_{suffix}"]
        if not scheme.startswith("rediss"):
            tls = {}  # a CA file from the environment does not turn TLS on; the scheme does
        for name, path in tls.items():
            if not os.path.isfile(path):
                raise ConfigError(f"redis {shown}: {name} {path}: no such file: give the PEM file's path")
        user = unquote(parts.username) if parts.username else env.get("DPSTREAM_REDIS_USERNAME") or None
        password = unquote(parts.password) if parts.password else env.get("DPSTREAM_REDIS_PASSWORD") or None
        raw_min = ours.get("min_replicas", env.get("DPSTREAM_REDIS_MIN_REPLICAS", ""))
        raw_wait = ours.get("wait_timeout_ms", env.get("DPSTREAM_REDIS_WAIT_TIMEOUT_MS", ""))
        namespace = ours.get("namespace", env.get("DPSTREAM_LEDGER_NAMESPACE", ""))
        common: dict[str, Any] = {
            "scheme": scheme,
            "display": shown,
            "username": user,
            "password": password,
            "tls_files": tuple(sorted(tls.items())),
            "min_replicas": _int(raw_min, "min_replicas", shown, 0) if raw_min else None,
            "wait_timeout_ms": _int(raw_wait, "wait_timeout_ms", shown, 1) if raw_wait else DEFAULT_WAIT_TIMEOUT_MS,
            "namespace": check_namespace(namespace, f"redis {shown}: namespace") if namespace else "",
        }
        if scheme in DIRECT_SCHEMES:
            direct = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment))
            return cls(direct_url=direct, **common)
        if scheme in CLUSTER_SCHEMES:
            if parts.path.strip("/") not in ("", "0"):
                raise ConfigError(f"redis {shown}: Redis Cluster has database 0 only: drop the /db part")
            return cls(sentinels=_hosts(parts.netloc.rsplit("@", 1)[-1], shown, "node"), **common)
        return cls(
            sentinels=_hosts(parts.netloc.rsplit("@", 1)[-1], shown, "sentinel"),
            service=(segments := [p for p in parts.path.split("/") if p] or [""])[0],
            db=_int(segments[1], "db", shown, 0) if len(segments) > 1 else 0,
            sentinel_username=env.get("DPSTREAM_SENTINEL_USERNAME") or None,
            sentinel_password=env.get("DPSTREAM_SENTINEL_PASSWORD") or None,
            **common,
        )._checked_sentinel()

    def _checked_sentinel(self) -> LedgerAddress:
        if not self.service:
            raise ConfigError(
                f"redis {self.display}: no master name: write redis+sentinel://host:port[,host:port]/MASTER[/db]"
            )
        return self

    def node_kwargs(self, sentinel: bool = False) -> dict[str, Any]:
        """redis-py connection keywords for any data node (primary or replica), or with `sentinel` for
        a sentinel itself: timeouts, credentials and TLS files."""
        out: dict[str, Any] = dict(_TIMEOUTS)
        username, password = (
            (self.sentinel_username, self.sentinel_password) if sentinel else (self.username, self.password)
        )
        if username:
            out["username"] = username
        if password:
            out["password"] = password
        if self.tls:
            out.update(dict(self.tls_files))
        return out

    def node_client(self, host: str, port: int) -> aioredis.Redis[bytes]:
        """A one-connection client to one data node (a replica, for the durability check)."""
        return aioredis.Redis(host=host, port=port, db=self.db, ssl=self.tls, **self.node_kwargs())


def _hosts(netloc: str, shown: str, what: str) -> tuple[tuple[str, int], ...]:
    out = []
    for item in netloc.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"redis {shown}: {what} {item!r}: write each {what} as host:port, comma-separated")
        out.append((host.strip("[]"), int(port)))
    return tuple(out)


class SentinelPool(SentinelConnectionPool):  # type: ignore[type-arg]  # generic in types-redis only
    """The Sentinel-managed pool of the primary; closing it also closes the clients of the sentinels."""

    async def aclose_sentinels(self) -> None:
        """Close the connections to the sentinels themselves."""
        for client in self.sentinel_manager.sentinels:
            await client.aclose()  # type: ignore[attr-defined]  # types-redis 4.6 predates aclose


def connect(url: str | LedgerAddress, max_connections: int = 128) -> aioredis.Redis[bytes]:
    """A redis.asyncio client with bounded pool, short timeouts and bytes replies (payloads stay exact).

    A Sentinel URL gives a client of the current primary: each new connection asks the sentinels
    where it is, so after a failover the next connection reaches the promoted replica.
    """
    address = url if isinstance(url, LedgerAddress) else LedgerAddress.parse(url)
    if address.cluster:
        cluster: RedisCluster[bytes] = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in address.sentinels],
            max_connections=max_connections,
            ssl=address.tls,
            **address.node_kwargs(),
        )
        # RedisCluster serves every command the ledger sends (one scope = one slot); typed as the
        # single-node client the ledger is written against
        return cast("aioredis.Redis[bytes]", cluster)
    if not address.sentinel:
        pool: aioredis.BlockingConnectionPool[aioredis.Connection] = aioredis.BlockingConnectionPool.from_url(
            address.direct_url, max_connections=max_connections, timeout=10, **address.node_kwargs()
        )
        return aioredis.Redis(connection_pool=pool)
    manager = Sentinel(
        list(address.sentinels), sentinel_kwargs=dict(address.node_kwargs(sentinel=True), ssl=address.tls)
    )
    client: aioredis.Redis[bytes] = manager.master_for(
        address.service,
        redis_class=aioredis.Redis,
        connection_pool_class=SentinelPool,
        max_connections=max_connections,
        db=address.db,
        ssl=address.tls,
        **address.node_kwargs(),
    )
    return client
