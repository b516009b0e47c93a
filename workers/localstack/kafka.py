"""Apache Kafka in KRaft mode (broker + controller in one JVM per node), from Maven Central jars: one
node, or a cluster of several (`KafkaCluster`, `stack up --brokers 3`) whose internal topics are replicated."""

from __future__ import annotations

__all__ = [
    "BrokerSecurity",
    "KafkaCluster",
    "KafkaHandle",
    "render_server_properties",
    "new_cluster_id",
    "start_kafka",
    "default_libs_dir",
]

import base64
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dpstream.topology.errors import ConfigError
from dpstream.workers.localstack import sysdeps
from dpstream.workers.localstack.errors import ServiceStartError
from dpstream.workers.localstack.handle import Progress, ServiceHandle, no_progress
from dpstream.workers.localstack.kafka_libs import ensure_libs
from dpstream.workers.localstack.paths import default_home, render_template, repo_deploy_dir
from dpstream.workers.localstack.ports import HOST, port_open
from dpstream.workers.runtime.admin import broker_ready
from dpstream.workers.runtime.kafka_security import KafkaSecurity, Protocol, Secret

_MAIN = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"


def default_libs_dir() -> Path:
    """Shared jar directory (`<home>/kafka/libs`), so tests and `up` download Kafka once per machine."""
    return default_home() / "kafka" / "libs"


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (as `kafka-storage random-uuid`)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not cid.startswith("-"):
            return cid


@dataclass(frozen=True)
class BrokerSecurity:
    """A SASL_SSL listener: TLS from a PKCS12 keystore, SCRAM users made at format time, and ACLs on
    (StandardAuthorizer; no ACL means no access). `admin` is the broker's own inter-broker user and the
    only super user besides the plaintext controller listener's (loopback, controller APIs only)."""

    keystore: Path
    keystore_password: Secret
    cafile: Path
    users: Mapping[str, Secret]
    truststore: Path | None = None
    """PKCS12 truststore with the CA (same password as the keystore), for the broker's own TLS clients."""
    admin: str = "admin"
    mechanism: str = "SCRAM-SHA-512"

    def client(self, user: str | None = None) -> KafkaSecurity:
        """Client settings of `user` (default the admin) against this listener."""
        name = user or self.admin
        return KafkaSecurity(Protocol.SASL_SSL, self.mechanism, name, self.users[name], cafile=str(self.cafile))

    def properties(self) -> str:
        """The server.properties lines of the listener (they hold secrets: the file is mode 0600)."""
        mech = self.mechanism
        admin_password = self.users[self.admin].reveal()
        return "\n".join(
            [
                f"sasl.enabled.mechanisms={mech}",
                f"sasl.mechanism.inter.broker.protocol={mech}",
                f"listener.name.sasl_ssl.{mech.lower()}.sasl.jaas.config="
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{self.admin}" password="{admin_password}";',
                "ssl.keystore.type=PKCS12",
                f"ssl.keystore.location={Path(self.keystore).resolve()}",
                f"ssl.keystore.password={self.keystore_password.reveal()}",
                "ssl.client.auth=none",
                *(
                    [
                        "ssl.truststore.type=PKCS12",
                        f"ssl.truststore.location={Path(self.truststore).resolve()}",
                        f"ssl.truststore.password={self.keystore_password.reveal()}",
                    ]
                    if self.truststore is not None
                    else []
                ),
                "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "allow.everyone.if.no.acl.found=false",
                f"super.users=User:{self.admin};User:ANONYMOUS",
            ]
        )

    def scram_arguments(self) -> list[str]:
        """`kafka-storage format --add-scram` arguments creating every user's SCRAM credential."""
        out: list[str] = []
        for name, password in self.users.items():
            out += ["--add-scram", f"{self.mechanism}=[name={name},password={password.reveal()}]"]
        return out

    def redact(self, text: str) -> str:
        """`text` with every password replaced by ***."""
        for secret in (self.keystore_password, *self.users.values()):
            text = text.replace(secret.reveal(), "***")
        return text


def render_server_properties(
    broker_port: int,
    controller_port: int,
    log_dir: Path,
    partitions: int = 4,
    auto_create_topics: bool = False,
    node_id: int = 1,
    voters: Sequence[tuple[int, int]] = (),
    security: BrokerSecurity | None = None,
) -> str:
    """server.properties of one KRaft node listening on 127.0.0.1 only (SASL_SSL with `security`).

    `voters` lists every node of the cluster as (node id, controller port); empty means a one-node
    cluster of this node. Internal topics get one replica per node up to 3, and `min.insync.replicas`
    2 from three nodes on (one node may fail without stopping `acks=all` producers).
    """
    quorum = tuple(voters) or ((node_id, controller_port),)
    replication = min(3, len(quorum))
    return render_template(
        "server.properties",
        broker_port=broker_port,
        controller_port=controller_port,
        log_dir=Path(log_dir).resolve(),
        partitions=partitions,
        auto_create_topics="true" if auto_create_topics else "false",
        node_id=node_id,
        quorum_voters=",".join(f"{node}@{HOST}:{port}" for node, port in quorum),
        replication=replication,
        min_insync=2 if replication >= 3 else 1,
        listener="SASL_SSL" if security is not None else "PLAINTEXT",
        security=security.properties() if security is not None else "",
    )


class KafkaHandle(ServiceHandle):
    """A local Kafka broker; data in `data_dir/data`, jars in `libs_dir` (shared, fetched once)."""

    name = "kafka"
    port_flag = "--kafka-port"

    def __init__(
        self,
        port: int,
        controller_port: int,
        data_dir: Path,
        libs_dir: Path | None = None,
        partitions: int = 4,
        heap: str = "512m",
        auto_create_topics: bool = False,
        start_timeout: float = 120.0,
        progress: Progress = no_progress,
        node_id: int = 1,
        voters: Sequence[tuple[int, int]] = (),
        cluster_id: str | None = None,
        security: BrokerSecurity | None = None,
    ) -> None:
        self.security = security
        """A SASL_SSL listener with SCRAM users and ACLs instead of PLAINTEXT (tests of Kafka security)."""
        self.controller_port = controller_port
        self.node_id = node_id
        self.voters = tuple(voters)
        """Every node of the cluster as (node id, controller port); empty for a one-node cluster."""
        self.cluster_id = cluster_id
        """The cluster's id when this node is one of several (they must share it); else its own file's."""
        self.libs_dir = Path(libs_dir).resolve() if libs_dir is not None else default_libs_dir()
        self.partitions = partitions
        self.heap = heap
        self.auto_create_topics = auto_create_topics
        super().__init__(port, data_dir, start_timeout, progress)

    @property
    def bootstrap(self) -> str:
        """Bootstrap servers string for aiokafka / faust (`127.0.0.1:PORT`)."""
        return f"{HOST}:{self.port}"

    @property
    def properties_file(self) -> Path:
        """The generated server.properties."""
        return self.data_dir / "server.properties"

    @property
    def log_dir(self) -> Path:
        """Kafka's log (data) directory, formatted once by StorageTool."""
        return self.data_dir / "data"

    @property
    def server_log(self) -> Path:
        """The broker's own log (log4j), as opposed to the JVM's stdout."""
        return self.data_dir / "logs" / "server.log"

    def log_files(self) -> list[Path]:
        """JVM output plus the broker's log4j file."""
        return [self.log_file, self.server_log]

    def create_topics(self, names: list[str], partitions: int | None = None) -> list[str]:
        """Create missing topics on this broker (idempotent); returns those created now."""
        from dpstream.workers.runtime.admin import create_topics

        return create_topics(self.bootstrap, names, partitions or self.partitions)

    def _marker(self) -> str:
        return str(self.data_dir / "server.properties")

    def _prepare(self) -> None:
        if port_open(self.controller_port):
            raise ConfigError(
                f"kafka: controller port 127.0.0.1:{self.controller_port} is already in use by another process: "
                "stop that process or pass --kafka-controller-port N"
            )
        sysdeps.ensure([sysdeps.JAVA], self.progress)
        ensure_libs(self.libs_dir, repo_deploy_dir() / "pom.xml", self.progress)
        self.properties_file.write_text(
            render_server_properties(
                self._port,
                self.controller_port,
                self.log_dir,
                self.partitions,
                self.auto_create_topics,
                node_id=self.node_id,
                voters=self.voters,
                security=self.security,
            ),
            encoding="utf-8",
        )
        self.properties_file.chmod(0o600)
        (self.data_dir / "log4j.properties").write_text(
            render_template("log4j.properties", log_file=self.server_log), encoding="utf-8"
        )
        self._format_once()

    def _format_once(self) -> None:
        """Run StorageTool format unless the log dir already carries meta.properties."""
        if (self.log_dir / "meta.properties").exists():
            return
        cluster_file = self.data_dir / "cluster.id"
        if self.cluster_id is not None:
            cluster_file.write_text(self.cluster_id + "\n", encoding="utf-8")
        elif not cluster_file.exists():
            cluster_file.write_text(new_cluster_id() + "\n", encoding="utf-8")
        cluster_id = cluster_file.read_text(encoding="utf-8").strip()
        argv = [
            *self._java(),
            _STORAGE_TOOL,
            "format",
            "--ignore-formatted",
            "-t",
            cluster_id,
            "-c",
            str(self.properties_file),
            *(self.security.scram_arguments() if self.security is not None else []),
        ]
        result = subprocess.run(argv, capture_output=True, text=True, cwd=self.data_dir, check=False)
        if result.returncode != 0:
            text = result.stdout + result.stderr
            out = (self.security.redact(text) if self.security is not None else text).strip().splitlines()[-15:]
            raise ServiceStartError(f"kafka StorageTool format failed (exit {result.returncode}):\n" + "\n".join(out))

    def _java(self) -> list[str]:
        return [
            shutil.which("java") or "java",
            f"-Xmx{self.heap}",
            f"-Xms{self.heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self.data_dir / 'log4j.properties'}",
            f"-Dkafka.logs.dir={self.data_dir / 'logs'}",
            "-cp",
            f"{self.libs_dir}{os.sep}*",
        ]

    def _argv(self) -> list[str]:
        return [*self._java(), _MAIN, str(self.properties_file)]

    def client_security(self) -> KafkaSecurity:
        """How a client reaches this broker as its admin (PLAINTEXT unless it has a SASL_SSL listener)."""
        return self.security.client() if self.security is not None else KafkaSecurity()

    def _ready(self) -> bool:
        return port_open(self._port) and broker_ready(self.bootstrap, security=self.client_security())


class KafkaCluster:
    """`brokers` KRaft nodes on 127.0.0.1, each broker and controller, in `root/kafka` (node 1, as the
    one-node stack) and `root/kafka-N`; node N listens on `port + 100·(N−1)` and its controller on
    `controller_port + 100·(N−1)`. Started together (a quorum needs a majority of its voters up)."""

    def __init__(
        self,
        brokers: int,
        port: int,
        controller_port: int,
        root: Path,
        libs_dir: Path | None = None,
        heap: str = "512m",
        start_timeout: float = 120.0,
        progress: Progress = no_progress,
    ) -> None:
        if brokers < 1:
            raise ConfigError(f"--brokers {brokers}: need at least 1 Kafka broker")
        self.root = Path(root).resolve()
        ids = range(1, brokers + 1)
        voters = [(n, controller_port + 100 * (n - 1)) for n in ids] if brokers > 1 else []
        self.nodes = [
            KafkaHandle(
                port + 100 * (n - 1),
                controller_port + 100 * (n - 1),
                self.node_dir(self.root, n),
                libs_dir=libs_dir,
                heap=heap,
                start_timeout=start_timeout,
                progress=progress,
                node_id=n,
                voters=voters,
            )
            for n in ids
        ]

    @staticmethod
    def node_dir(root: Path, node: int) -> Path:
        """State directory of node `node` (1-based) under the stack's home."""
        return Path(root) / ("kafka" if node == 1 else f"kafka-{node}")

    def _cluster_id(self, brokers: int) -> str:
        """The cluster's shared id, made once; refuses state formatted for another number of brokers."""
        first = self.node_dir(self.root, 1)
        marker = first / "brokers"
        formatted = (first / "data" / "meta.properties").exists()
        if formatted and (not marker.exists() or marker.read_text(encoding="utf-8").strip() != str(brokers)):
            was = marker.read_text(encoding="utf-8").strip() if marker.exists() else "1"
            raise ConfigError(
                f"kafka: the state in {first} belongs to a {was}-broker cluster, not {brokers}: "
                f"run `stack down`, then remove {self.root}/kafka* or pass another --home"
            )
        first.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{brokers}\n", encoding="utf-8")
        cluster_file = first / "cluster.id"
        if not cluster_file.exists():
            cluster_file.write_text(new_cluster_id() + "\n", encoding="utf-8")
        return cluster_file.read_text(encoding="utf-8").strip()

    @property
    def bootstrap(self) -> str:
        """Every node's `127.0.0.1:PORT`, comma-separated (clients find the rest from any one)."""
        return ",".join(node.bootstrap for node in self.nodes)

    def start(self) -> bool:
        """Start every node not running (in parallel) and wait until the cluster lists them all; True if
        any was started."""
        if len(self.nodes) > 1:
            cluster_id = self._cluster_id(len(self.nodes))
            for node in self.nodes:
                node.cluster_id = cluster_id
        with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
            started = list(pool.map(lambda node: node.start(), self.nodes))
        self.wait_brokers(len(self.nodes))
        return any(started)

    def wait_brokers(self, count: int, timeout: float = 120.0) -> None:
        """Wait until every node's metadata lists `count` live brokers: topics with RF 3 need all three, and
        a node that has not yet learnt of the others would answer a topic creation with fewer."""
        from dpstream.workers.runtime.admin import broker_count

        deadline = time.monotonic() + timeout
        while min(broker_count(node.bootstrap) for node in self.nodes) < count:
            if time.monotonic() > deadline:
                raise ServiceStartError(f"kafka: fewer than {count} brokers registered after {timeout:.0f} s")
            time.sleep(0.5)

    def stop(self) -> bool:
        """Stop every node at once (graceful; one by one, the last would wait for a lost quorum); True if
        any was running."""
        with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
            return any(list(pool.map(lambda node: node.stop(), self.nodes)))


def start_kafka(
    port: int,
    controller_port: int,
    data_dir: Path,
    libs_dir: Path | None = None,
    progress: Progress = no_progress,
) -> KafkaHandle:
    """Start (or find already running) a one-node Kafka on 127.0.0.1:`port` with its data in `data_dir`."""
    handle = KafkaHandle(port, controller_port, data_dir, libs_dir=libs_dir, progress=progress)
    handle.start()
    return handle
