"""Kafka security against a real KRaft broker with a SASL_SSL listener: TLS from a CA and a broker
keystore this test generates (openssl, Java's keytool), SCRAM-SHA-512 users made at format time, and
ACLs on (no ACL, no access).

A `dpstream worker` holding only the worker principal's ACLs (as the README lists them; granted with
kafka-python's admin client) releases every window; a reader principal may read the releases topic but
not the topics holding true aggregates; a plaintext client is refused; no password appears in any
output, also not when the password is wrong.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dpstream.topology.loader import load_topology
from dpstream.workers.localstack.kafka import BrokerSecurity, KafkaHandle
from dpstream.workers.localstack.ports import free_port
from dpstream.workers.runtime.admin import broker_ready
from dpstream.workers.runtime.kafka_security import KafkaSecurity, Secret
from dpstream.workers.runtime.topics import ensure_topics
from tests.e2e.harness import TOPOLOGY, Deployment, event, poll

pytestmark = pytest.mark.integration

WINDOW = 2
USERS = ("admin", "worker", "reader")


def _run(argv: list[str], cwd: Path) -> None:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{argv[0]} failed: {result.stderr[-2000:]}"


def _make_tls(directory: Path, store_password: str) -> tuple[Path, Path, Path]:
    """A self-signed CA, a broker certificate for 127.0.0.1 signed by it in a PKCS12 keystore, and a
    PKCS12 truststore holding the CA (keytool); returns (ca.pem, keystore, truststore)."""
    if not shutil.which("openssl") or not shutil.which("keytool"):
        pytest.skip("needs openssl and keytool (Java 17)")
    days, pw = "2", f"pass:{store_password}"
    _run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
          "-days", days, "-subj", "/CN=dpstream test CA"], directory)  # fmt: skip
    _run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
          "-subj", "/CN=127.0.0.1"], directory)  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _run(["openssl", "x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
          "-out", "broker.pem", "-days", days, "-extfile", "san.ext"], directory)  # fmt: skip
    _run(["openssl", "pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key", "-certfile", "ca.pem",
          "-name", "broker", "-out", "broker.p12", "-passout", pw], directory)  # fmt: skip
    _run(["keytool", "-importcert", "-noprompt", "-alias", "ca", "-file", "ca.pem", "-keystore", "trust.p12",
          "-storetype", "PKCS12", "-storepass", store_password], directory)  # fmt: skip
    return directory / "ca.pem", directory / "broker.p12", directory / "trust.p12"


@dataclass
class SecureBroker:
    """The broker, its security settings, and the secrets a test must never see printed."""

    handle: KafkaHandle
    security: BrokerSecurity

    @property
    def bootstrap(self) -> str:
        return self.handle.bootstrap

    def env(self, user: str, password: str | None = None) -> dict[str, str]:
        """DPSTREAM_KAFKA_* variables of `user` (its real password unless one is given)."""
        return {
            "DPSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "DPSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "DPSTREAM_KAFKA_SASL_USERNAME": user,
            "DPSTREAM_KAFKA_SASL_PASSWORD": password or self.security.users[user].reveal(),
            "DPSTREAM_KAFKA_SSL_CAFILE": str(self.security.cafile),
        }

    def secrets(self) -> list[str]:
        return [self.security.keystore_password.reveal(), *(p.reveal() for p in self.security.users.values())]

    def grant(self, principal: str, ops: tuple[str, ...], resource: str, name: str, prefixed: bool = False) -> None:
        """Allow `principal` each of `ops` on one resource (TOPIC, GROUP or CLUSTER), as the admin."""
        from kafka.admin import (
            ACL,
            ACLOperation,
            ACLPermissionType,
            ACLResourcePatternType,
            KafkaAdminClient,
            ResourcePattern,
            ResourceType,
        )

        pattern_type = ACLResourcePatternType.PREFIXED if prefixed else ACLResourcePatternType.LITERAL
        pattern = ResourcePattern(ResourceType[resource], name, pattern_type)
        acls = [ACL(f"User:{principal}", "*", ACLOperation[op], ACLPermissionType.ALLOW, pattern) for op in ops]
        admin = KafkaAdminClient(
            bootstrap_servers=self.bootstrap,
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username="admin",
            sasl_plain_password=self.security.users["admin"].reveal(),
            ssl_cafile=str(self.security.cafile),
        )
        try:
            result = admin.create_acls(acls)
        finally:
            admin.close()
        assert not result["failed"], result["failed"]


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """A one-node KRaft broker whose client listener is SASL_SSL only, with ACLs on."""
    root = tmp_path_factory.mktemp("kafka-sasl-ssl")
    store_password = secrets.token_urlsafe(16)
    cafile, keystore, truststore = _make_tls(root, store_password)
    users = {name: Secret(f"{name}-{secrets.token_urlsafe(18)}") for name in USERS}
    security = BrokerSecurity(keystore, Secret(store_password), cafile, users, truststore=truststore)
    port = free_port()
    handle = KafkaHandle(port, free_port(avoid=frozenset({port})), root / "kafka", security=security, heap="384m")
    handle.start()
    try:
        yield SecureBroker(handle, security)
    finally:
        handle.stop()


def _grant_worker(broker: SecureBroker, dep: Deployment) -> None:
    """The worker principal's ACLs, as the README lists them (topics by name, Faust's by the app prefix),
    and the reader's: the releases topic only."""
    sinks, source = dep.topology.sinks, dep.source_topic
    rwdc = ("READ", "WRITE", "DESCRIBE", "CREATE")
    configs = ("DESCRIBE_CONFIGS",)  # the start checks the timestamp type of these topics
    broker.grant("worker", ("READ", "DESCRIBE", "CREATE", *configs), "TOPIC", source)
    broker.grant("worker", rwdc, "TOPIC", sinks.partials_topic)
    broker.grant("worker", (*rwdc, *configs), "TOPIC", f"{source}.by-unit")
    broker.grant("worker", ("WRITE", "DESCRIBE", "CREATE", *configs), "TOPIC", sinks.releases)
    broker.grant("worker", ("WRITE", "DESCRIBE", "CREATE"), "TOPIC", sinks.dead_letter)
    broker.grant("worker", (*rwdc, *configs), "TOPIC", "dpstream-", prefixed=True)
    broker.grant("worker", ("READ", "DESCRIBE"), "GROUP", "dpstream-", prefixed=True)
    broker.grant("reader", ("READ", "DESCRIBE"), "TOPIC", sinks.releases)
    broker.grant("reader", ("READ", "DESCRIBE"), "GROUP", "reader-", prefixed=True)


async def _produce(broker: SecureBroker, topic: str, events: list[tuple[bytes, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap, acks="all", **broker.security.client().client_options()
    )
    await producer.start()
    try:
        for key, value in events:
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def _read(broker: SecureBroker, user: str, topic: str) -> list[bytes]:
    """Every record of `topic` as `user` (consumer group `reader-…`), up to its end offsets now."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        group_id=f"reader-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **broker.security.client(user).client_options(),
    )
    await consumer.start()
    try:
        out: list[bytes] = []
        batches = await consumer.getmany(timeout_ms=3000)
        while batches:
            out += [m.value for records in batches.values() for m in records if m.value is not None]
            batches = await consumer.getmany(timeout_ms=1000)
        return out
    finally:
        await consumer.stop()


def _deploy(tmp_path: Path, broker: SecureBroker, redis_url: str) -> Deployment:
    prefix = f"sec-{uuid.uuid4().hex[:10]}"
    path = tmp_path / prefix / "topology.yaml"
    path.parent.mkdir(parents=True)
    start = int(time.time()) // WINDOW * WINDOW
    path.write_text(
        TOPOLOGY.format(
            prefix=prefix, keyed="true", epsilon=1.0, start=start, source_topic=f"{prefix}.clicks", period="1d"
        )
    )
    return Deployment(path, load_topology(path), broker.bootstrap, redis_url)


def test_worker_over_sasl_ssl_releases_with_its_acls_and_never_prints_a_secret(
    tmp_path: Path, secure_broker: SecureBroker, fresh_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With only the README's ACLs, a worker over SASL_SSL releases every window; the reader principal
    reads releases but is refused the partials topic and the changelog; no password in any output."""
    from aiokafka.errors import KafkaError

    broker = secure_broker
    dep = _deploy(tmp_path, broker, fresh_redis.url)
    _grant_worker(broker, dep)
    for name, value in broker.env("worker").items():
        monkeypatch.setenv(name, value)
    ensure_topics(broker.bootstrap, dep.topology)  # as the worker principal, from the environment
    dep.start_worker("w1", env=broker.env("worker"))
    try:
        t0 = (int(time.time()) // WINDOW + 2) * WINDOW
        events = [event(f"u{i}", t0 + 0.5 + (i % 3) * WINDOW) for i in range(60)]
        while time.time() < t0:
            time.sleep(0.05)
        asyncio.run(_produce(broker, dep.source_topic, events))
        want = {(m, t0 + k * WINDOW) for m in dep.topology.metrics for k in range(3)}

        def released() -> list[dict[str, Any]] | None:
            recs = [json.loads(v) for v in asyncio.run(_read(broker, "reader", dep.topology.sinks.releases))]
            return recs if want <= {(r["metric"], r["window"]["start_epoch"]) for r in recs} else None

        recs = poll(released, timeout_s=120, every_s=2)
        assert recs, dep.log("w1")[-3000:]
        changelog = next(t for t in _topics(broker) if t.endswith("dpstream-mergers-changelog"))
        for secret_topic in (dep.topology.sinks.partials_topic, changelog):
            with pytest.raises(KafkaError):
                asyncio.run(_read(broker, "reader", secret_topic))
        assert not broker_ready(broker.bootstrap, security=KafkaSecurity())  # plaintext is refused
    finally:
        dep.stop_all()
    outputs = dep.log("w1") + broker.handle.log_tail(2000)
    for secret in broker.secrets():
        assert secret not in outputs


def _topics(broker: SecureBroker) -> set[str]:
    from aiokafka.admin import AIOKafkaAdminClient

    async def run() -> set[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap, **broker.security.client().client_options())
        await admin.start()
        try:
            return set(await admin.list_topics())
        finally:
            await admin.close()

    return asyncio.run(run())


def test_a_wrong_password_fails_in_one_line_without_any_password(
    tmp_path: Path, secure_broker: SecureBroker, fresh_redis: Any
) -> None:
    """A worker with a wrong SCRAM password exits 2 with one line naming the variables to fix; neither
    the wrong nor any real password is printed."""
    broker = secure_broker
    dep = _deploy(tmp_path, broker, fresh_redis.url)
    wrong = f"wrong-{secrets.token_urlsafe(12)}"
    argv = [sys.executable, "-m", "dpstream.workers.cli", "worker", str(dep.path), "--bootstrap", broker.bootstrap,
            "--redis", fresh_redis.url]  # fmt: skip
    env = {**os.environ, **broker.env("worker", password=wrong)}
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert len(output.strip().splitlines()) == 1, output
    assert "SASL authentication failed" in output and "DPSTREAM_KAFKA_SASL_PASSWORD" in output
    for secret in (wrong, *broker.secrets()):
        assert secret not in output
