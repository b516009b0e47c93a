"""A ledger Redis with TLS and ACL users on loopback, and a throwaway CA to go with it (openssl CLI).

Debian's redis-server 7.0 is built with TLS (`tls-port`). The ACL file disables the default user
and holds an admin, a dedicated ledger user limited to `ledger.connection.LEDGER_ACL_COMMANDS` on
`dpstream:*` keys, and the `replica` and `sentinel` users replication and Sentinel need (the
commands Redis's documentation lists for them); passwords are stored as SHA-256 (`#…`).
"""

from __future__ import annotations

__all__ = ["NodeSecurity", "SecureRedisHandle", "SecureReplicaHandle", "TlsFiles", "make_certificates"]

import hashlib
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpstream.topology.errors import ConfigError
from dpstream.workers.ledger.connection import LEDGER_ACL_COMMANDS
from dpstream.workers.localstack.handle import Progress, no_progress
from dpstream.workers.localstack.paths import render_template
from dpstream.workers.localstack.ports import HOST
from dpstream.workers.localstack.redis import RedisHandle


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA's certificate, and a server certificate it signed with its key."""

    ca: Path
    cert: Path
    key: Path


@dataclass(frozen=True)
class NodeSecurity:
    """TLS files and the passwords of the ACL users every node of a group shares."""

    tls: TlsFiles
    admin_password: str = field(repr=False)
    ledger_password: str = field(repr=False)
    replica_password: str = field(default_factory=lambda: secrets.token_urlsafe(18), repr=False)
    sentinel_password: str = field(default_factory=lambda: secrets.token_urlsafe(18), repr=False)

    def admin_kwargs(self) -> dict[str, Any]:
        """redis-py keywords for an admin connection over TLS (the stack's own probes)."""
        return {"username": "admin", "password": self.admin_password, **self.tls_kwargs()}

    def tls_kwargs(self) -> dict[str, Any]:
        """redis-py keywords for a TLS connection that verifies the server against the CA."""
        return {"ssl": True, "ssl_ca_certs": str(self.tls.ca)}

    def tls_conf(self, port: int) -> str:
        """The TLS lines of a server's or a sentinel's config (no plain-text port)."""
        return (
            f'port 0\ntls-port {port}\ntls-cert-file "{self.tls.cert}"\ntls-key-file "{self.tls.key}"\n'
            f'tls-ca-cert-file "{self.tls.ca}"\ntls-auth-clients no\ntls-replication yes\n'
        )


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise ConfigError("missing openssl: install with `sudo apt-get install -y openssl` and run again")
    done = subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise ConfigError(f"openssl {args[0]} failed: {last[0]}")


def make_certificates(directory: Path, name: str = "redis") -> TlsFiles:
    """A self-signed CA and a server certificate for 127.0.0.1 / localhost signed by it, in `directory`
    (P-256 keys, valid two days: for tests and the local stack only)."""
    d = Path(directory).resolve()
    d.mkdir(parents=True, exist_ok=True)
    subj = "/O=dpstream local stack"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-days", "2", "-subj", f"{subj}/CN=dpstream test CA", "-keyout", "ca.key",
             "-out", "ca.pem", cwd=d)  # fmt: skip
    _openssl("req", *ec, "-subj", f"{subj}/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n", encoding="utf-8")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", "san.ext", "-out", f"{name}.pem", cwd=d)  # fmt: skip
    return TlsFiles(d / "ca.pem", d / f"{name}.pem", d / f"{name}.key")


def _sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


class SecureRedisHandle(RedisHandle):
    """A redis-server on a TLS-only port with ACL users `admin` and `ledger` (passwords given, kept hashed)."""

    def __init__(
        self,
        port: int,
        data_dir: Path,
        security: NodeSecurity,
        *,
        ledger_user: str = "ledger",
        progress: Progress = no_progress,
    ) -> None:
        super().__init__(port, data_dir, progress=progress)
        self.security = security
        self.tls = security.tls
        self.ledger_user = ledger_user

    @property
    def url(self) -> str:
        """`rediss://ledger@127.0.0.1:port/0`: the ledger user, its password left to the environment."""
        return f"rediss://{self.ledger_user}@{HOST}:{self.port}/0"

    @property
    def acl_file(self) -> Path:
        """The generated ACL file (SHA-256 passwords)."""
        return self.data_dir / "users.acl"

    def _prepare(self) -> None:
        super()._prepare()
        acl = render_template(
            "redis-users.acl",
            admin_user="admin",
            admin_sha256=_sha256(self.security.admin_password),
            ledger_user=self.ledger_user,
            ledger_sha256=_sha256(self.security.ledger_password),
            ledger_commands=LEDGER_ACL_COMMANDS,
            replica_sha256=_sha256(self.security.replica_password),
            sentinel_sha256=_sha256(self.security.sentinel_password),
        )
        self.acl_file.write_text(acl, encoding="utf-8")
        extra = render_template(
            "redis-tls.conf",
            port=self._port,
            cert_file=self.tls.cert,
            key_file=self.tls.key,
            ca_file=self.tls.ca,
            auth_clients="no",
            acl_file=self.acl_file,
        )
        # every node can become a replica (Sentinel turns a returning primary into one): it then
        # replicates as user `replica`
        extra += f"masteruser replica\nmasterauth {self.security.replica_password}\n"
        with self.conf_file.open("a", encoding="utf-8") as conf:
            conf.write("\n" + extra)

    def _ready(self) -> bool:
        import redis

        client = redis.Redis(
            host=HOST, port=self._port, socket_connect_timeout=0.5, socket_timeout=1.0, **self.security.admin_kwargs()
        )
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return False
        finally:
            client.close()


class SecureReplicaHandle(SecureRedisHandle):
    """A SecureRedisHandle started as a replica of `primary_port` (over TLS, as user `replica`)."""

    def __init__(self, port: int, data_dir: Path, security: NodeSecurity, primary_port: int) -> None:
        super().__init__(port, data_dir, security)
        self.primary_port = primary_port

    def _prepare(self) -> None:
        super()._prepare()
        extra = render_template("redis-replica.conf", primary_port=self.primary_port, auth="")
        with self.conf_file.open("a", encoding="utf-8") as conf:
            conf.write("\n" + extra)
