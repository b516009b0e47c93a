"""Kafka topic administration through aiokafka: is the broker up, and create topics (idempotent).

The worker creates its topology's topics at start (`runtime.topics.ensure_topics`); the local
stack, the test fixtures and the benchmarks use the same calls. This module is part of the
runtime, so it needs only a reachable broker, never a checkout of the repository.
"""

from __future__ import annotations

__all__ = [
    "TopicAdminError",
    "broker_count",
    "broker_ready",
    "client_options",
    "create_topics",
    "create_topics_async",
    "describe_topic_config_async",
    "replication_for",
    "run_sync",
    "start_admin",
]

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from dpstream.topology.errors import ConfigError, DpstreamError
from dpstream.workers.runtime.kafka_security import KafkaSecurity

_T = TypeVar("_T")
_TOPIC_ALREADY_EXISTS = 36
_UNKNOWN_TOPIC = 3
_TOPIC_AUTHORIZATION_FAILED = 29
_CONFIG_SET_ON_TOPIC = 1
"""DescribeConfigs `config_source` of a value set on the topic itself (DYNAMIC_TOPIC_CONFIG)."""


class TopicAdminError(DpstreamError):
    """The broker did not create or describe topics (unreachable, or partitions without a leader in time)."""


def client_options(security: KafkaSecurity | None) -> dict[str, Any]:
    """TLS/SASL keywords of an aiokafka client: `security`'s, or the environment's when None."""
    return (security or KafkaSecurity.from_env()).client_options()


class _Captured(logging.Handler):
    """Keeps the aiokafka records logged while a client bootstraps (they hold the cause of a failure)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _bootstrap_logs() -> Iterator[_Captured]:
    """Hold aiokafka's connection warnings back while a client starts: a failed start becomes one line
    (`_start_failure`) instead of a log line per broker and then the error."""
    logger = logging.getLogger("aiokafka")
    captured = _Captured()
    logger.addHandler(captured)
    propagate, logger.propagate = logger.propagate, False
    try:
        yield captured
    finally:
        logger.propagate = propagate
        logger.removeHandler(captured)


def _start_failure(bootstrap: str, captured: _Captured, exc: Exception) -> DpstreamError:
    """The one-line error of a client that could not bootstrap: bad credentials or TLS are the user's to fix."""
    text = " ".join(captured.messages)
    prefix = "DPSTREAM_KAFKA_"
    if "SaslAuthenticationFailed" in text or "Authentication failed" in text:
        return ConfigError(
            f"Kafka at {bootstrap}: SASL authentication failed (wrong user, password or mechanism); "
            f"check {prefix}SASL_USERNAME, {prefix}SASL_PASSWORD and {prefix}SASL_MECHANISM"
        )
    if "CERTIFICATE_VERIFY_FAILED" in text or "SSLError" in text or "SSL" in type(exc).__name__:
        return ConfigError(
            f"Kafka at {bootstrap}: TLS handshake failed (the broker's certificate is not trusted or the "
            f"protocol does not match); check {prefix}SSL_CAFILE and {prefix}SECURITY_PROTOCOL"
        )
    return TopicAdminError(f"Kafka at {bootstrap}: cannot connect ({type(exc).__name__}); check that the broker runs")


async def start_admin(bootstrap: str, timeout_ms: int, security: KafkaSecurity | None) -> Any:
    """A started AIOKafkaAdminClient; a failed start raises one line (ConfigError for credentials/TLS)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms, **client_options(security))
    with _bootstrap_logs() as captured:
        try:
            await admin.start()
        except (KafkaError, OSError) as exc:
            await admin.close()
            raise _start_failure(bootstrap, captured, exc) from None
    return admin


def run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine to completion from sync code, also when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _broker_ready_async(bootstrap: str, timeout_ms: int, security: KafkaSecurity | None) -> bool:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms, **client_options(security))
    try:
        with _bootstrap_logs():
            await admin.start()
        cluster = await admin.describe_cluster()
        return bool(cluster.get("brokers")) and cluster.get("controller_id", -1) != -1
    except (TimeoutError, KafkaError, OSError):
        return False
    finally:
        await admin.close()


def broker_ready(bootstrap: str, timeout_ms: int = 3000, security: KafkaSecurity | None = None) -> bool:
    """True when the broker answers a metadata request and knows its controller."""
    return run_sync(_broker_ready_async(bootstrap, timeout_ms, security))


async def broker_count_async(bootstrap: str, timeout_ms: int = 3000, security: KafkaSecurity | None = None) -> int:
    """Live brokers the cluster's metadata lists (0 when unreachable)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms, **client_options(security))
    try:
        with _bootstrap_logs():
            await admin.start()
        return len((await admin.describe_cluster()).get("brokers") or ())
    except (TimeoutError, KafkaError, OSError):
        return 0
    finally:
        await admin.close()


def broker_count(bootstrap: str, timeout_ms: int = 3000, security: KafkaSecurity | None = None) -> int:
    """Sync form of `broker_count_async`."""
    return run_sync(broker_count_async(bootstrap, timeout_ms, security))


def replication_for(brokers: int) -> tuple[int, dict[str, str]]:
    """Replication factor and topic configs of the topics dpstream creates on a cluster of `brokers`:
    3 replicas with `min.insync.replicas=2` from three brokers on (an `acks=all` write
    survives one broker's loss, and a broker may fail without stopping writes); fewer brokers get
    one replica each and `min.insync.replicas=1`, what they allow."""
    replicas = max(1, min(3, brokers))
    return replicas, {"min.insync.replicas": "2" if replicas >= 3 else "1"}


async def create_topics_async(
    bootstrap: str,
    names: Sequence[str],
    partitions: int = 4,
    timeout_s: float = 30.0,
    configs: Mapping[str, Mapping[str, str]] | None = None,
    security: KafkaSecurity | None = None,
) -> list[str]:
    """Create the topics that do not exist yet and wait until every partition has a leader.

    Replication follows the cluster's size (`replication_for`: 3 replicas and `min.insync.replicas=2`
    on three or more brokers). `configs` maps a topic name to its topic configs at creation, e.g.
    source topics get `{"message.timestamp.type": "LogAppendTime"}` (inclusion by arrival).
    Returns the names created now; existing topics are left as they are (their configs are not changed).
    """
    from aiokafka.admin import NewTopic
    from aiokafka.errors import KafkaError, for_code

    if partitions < 1:
        raise ConfigError(f"partitions {partitions}: a topic needs at least 1 partition")
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return []
    admin = await start_admin(bootstrap, int(timeout_s * 1000), security)
    try:
        # Only missing topics are created: a worker needs no Create ACL on topics an operator made.
        described = await admin.describe_topics(wanted)
        for t in described:
            if t["error_code"] == _TOPIC_AUTHORIZATION_FAILED:
                raise ConfigError(
                    f"topic {t['topic']!r}: this Kafka user may not describe it; grant the worker's principal "
                    "the topic ACLs listed in the README (deploy: Kafka ACLs)"
                )
        missing = [t["topic"] for t in described if t["error_code"] == _UNKNOWN_TOPIC]
        created: list[str] = []
        if not missing:
            await _wait_leaders(admin, wanted, timeout_s)
            return created
        replicas, durable = replication_for(len((await admin.describe_cluster()).get("brokers") or ()))
        response = await admin.create_topics(
            [
                NewTopic(name, partitions, replicas, topic_configs={**durable, **(configs or {}).get(name, {})})
                for name in missing
            ],
            timeout_ms=int(timeout_s * 1000),
        )
        for entry in response.topic_errors:
            topic, code = entry[0], entry[1]
            if code == 0:
                created.append(topic)
            elif code != _TOPIC_ALREADY_EXISTS:
                message = entry[2] if len(entry) > 2 and entry[2] else for_code(code).__name__
                raise ConfigError(f"topic {topic!r}: the broker refused to create it: {message}")
        await _wait_leaders(admin, wanted, timeout_s)
        return created
    except KafkaError as exc:
        raise TopicAdminError(f"Kafka at {bootstrap}: topic creation failed: {exc!r}") from exc
    finally:
        await admin.close()


async def describe_topic_config_async(
    bootstrap: str, names: Sequence[str], key: str, security: KafkaSecurity | None = None, timeout_s: float = 30.0
) -> dict[str, tuple[str, bool]]:
    """Each existing topic's effective value of config `key` (the broker's default where the topic sets
    none), and whether the topic sets it itself. A topic this Kafka user may not describe the configs of
    is one line naming the ACL to grant (ConfigError); a topic that does not exist is left out."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
    from aiokafka.errors import KafkaError

    wanted = list(dict.fromkeys(names))
    if not wanted:
        return {}
    admin = await start_admin(bootstrap, int(timeout_s * 1000), security)
    try:
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in wanted])
    except KafkaError as exc:
        raise TopicAdminError(f"Kafka at {bootstrap}: describing topic configs failed: {exc!r}") from exc
    finally:
        await admin.close()
    out: dict[str, tuple[str, bool]] = {}
    for response in responses:
        for error_code, _message, _type, topic, entries in (r[:5] for r in response.resources):
            if error_code == _TOPIC_AUTHORIZATION_FAILED:
                raise ConfigError(
                    f"topic {topic!r}: this Kafka user may not read its configs; grant the worker's principal "
                    "DescribeConfigs on it (the topic ACLs listed in the README, deploy: Kafka ACLs)"
                )
            if error_code != 0:
                continue  # no such topic: nothing to check
            for entry in entries:
                if entry[0] == key and entry[1] is not None:
                    out[topic] = (entry[1], entry[3] == _CONFIG_SET_ON_TOPIC)
    return out


async def _wait_leaders(admin: Any, names: list[str], timeout_s: float) -> None:
    """Poll metadata until every partition of every topic has a leader (new topics take a moment)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        topics = await admin.describe_topics(names)
        ok = {
            t["topic"]
            for t in topics
            if t["error_code"] == 0 and t["partitions"] and all(p["leader"] >= 0 for p in t["partitions"])
        }
        if ok >= set(names):
            return
        if loop.time() >= deadline:
            raise TopicAdminError(f"topics {sorted(set(names) - ok)} have no partition leader after {timeout_s:.0f} s")
        await asyncio.sleep(0.1)


def create_topics(
    bootstrap: str,
    names: Sequence[str],
    partitions: int = 4,
    timeout_s: float = 30.0,
    configs: Mapping[str, Mapping[str, str]] | None = None,
    security: KafkaSecurity | None = None,
) -> list[str]:
    """Sync form of `create_topics_async` (idempotent): create missing topics, return those created now."""
    return run_sync(create_topics_async(bootstrap, names, partitions, timeout_s, configs, security))
