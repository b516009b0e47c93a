"""How every Kafka client of a worker authenticates: TLS and SASL/SCRAM, from the environment or
the topology's `kafka:` section (a variable set wins; the password only ever from the environment).

One place builds the keywords of every aiokafka client (consumers, producers, admin) and Faust's
`broker_credentials`, so no client connects in plaintext while another uses TLS. The password is a
`Secret`: it prints as `***` (repr, str, error messages), and only the client keywords hold it.

Environment (a variable left unset keeps the default):
  DPSTREAM_KAFKA_SECURITY_PROTOCOL  PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL (default: SASL_SSL when a
                                    SASL user is set, SSL when a CA file is, else PLAINTEXT)
  DPSTREAM_KAFKA_SASL_MECHANISM     SCRAM-SHA-512 (default) | SCRAM-SHA-256 | PLAIN
  DPSTREAM_KAFKA_SASL_USERNAME, DPSTREAM_KAFKA_SASL_PASSWORD (or DPSTREAM_KAFKA_SASL_PASSWORD_FILE)
  DPSTREAM_KAFKA_SSL_CAFILE         CA bundle that signed the brokers' certificates (default: system CAs)
  DPSTREAM_KAFKA_SSL_CERTFILE, DPSTREAM_KAFKA_SSL_KEYFILE  client certificate for mutual TLS (optional)
"""

from __future__ import annotations

__all__ = ["ENV_PREFIX", "KafkaSecurity", "Protocol", "Secret"]

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import KAFKA_SASL_MECHANISMS as _MECHANISMS
from dpstream.topology.model import KafkaProtocol as Protocol
from dpstream.topology.model import KafkaSettings

ENV_PREFIX = "DPSTREAM_KAFKA_"


class Secret:
    """A password that never prints: repr and str are `***`; `reveal()` is for the client keywords only."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself, to hand to a Kafka client."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class KafkaSecurity:
    """TLS and SASL settings shared by every Kafka client of one process."""

    protocol: Protocol = Protocol.PLAINTEXT
    mechanism: str = "SCRAM-SHA-512"
    username: str | None = None
    password: Secret | None = field(default=None, repr=False)
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None

    def __post_init__(self) -> None:
        env = ENV_PREFIX
        if self.mechanism not in _MECHANISMS:
            raise ConfigError(
                f"{env}SASL_MECHANISM {self.mechanism!r}: unsupported; use one of {', '.join(_MECHANISMS)}"
            )
        if self.protocol.sasl and not (self.username and self.password):
            raise ConfigError(
                f"{env}SECURITY_PROTOCOL {self.protocol.value}: needs a user; set {env}SASL_USERNAME and "
                f"{env}SASL_PASSWORD (or {env}SASL_PASSWORD_FILE)"
            )
        if not self.protocol.sasl and (self.username or self.password):
            raise ConfigError(
                f"{env}SASL_USERNAME/PASSWORD: set, but {env}SECURITY_PROTOCOL is {self.protocol.value}; "
                "use SASL_SSL (or unset the user)"
            )
        if not self.protocol.tls and (self.cafile or self.certfile):
            raise ConfigError(
                f"{env}SSL_CAFILE/CERTFILE: set, but {env}SECURITY_PROTOCOL is {self.protocol.value} (no TLS); "
                "use SSL or SASL_SSL"
            )
        if bool(self.certfile) != bool(self.keyfile):
            raise ConfigError(f"{env}SSL_CERTFILE and {env}SSL_KEYFILE: give both (mutual TLS) or neither")
        for name, path in (("SSL_CAFILE", self.cafile), ("SSL_CERTFILE", self.certfile), ("SSL_KEYFILE", self.keyfile)):
            if path and not Path(path).is_file():
                raise ConfigError(f"{env}{name} {path}: no such file; give the path of a PEM file")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, kafka: KafkaSettings | None = None) -> KafkaSecurity:
        """The settings in `DPSTREAM_KAFKA_*` variables (see the module docstring), each unset one
        taken from the topology's `kafka:` section when given."""
        env = os.environ if env is None else env
        kafka = kafka or KafkaSettings()
        in_file = {
            "SECURITY_PROTOCOL": kafka.security_protocol.value if kafka.security_protocol else None,
            "SASL_MECHANISM": kafka.sasl_mechanism,
            "SASL_USERNAME": kafka.sasl_username,
            "SSL_CAFILE": kafka.ssl_cafile,
        }

        def get(name: str) -> str | None:
            return env.get(ENV_PREFIX + name, "").strip() or in_file.get(name)

        password = env.get(ENV_PREFIX + "SASL_PASSWORD") or None
        password_file = get("SASL_PASSWORD_FILE")
        if password_file:
            try:
                password = Path(password_file).read_text(encoding="utf-8").rstrip("\r\n")
            except OSError as exc:
                raise ConfigError(
                    f"{ENV_PREFIX}SASL_PASSWORD_FILE {password_file}: cannot read it ({exc.strerror}); "
                    "give a readable file holding the password"
                ) from None
        username, cafile = get("SASL_USERNAME"), get("SSL_CAFILE")
        default = Protocol.SASL_SSL if username else Protocol.SSL if cafile else Protocol.PLAINTEXT
        raw = (get("SECURITY_PROTOCOL") or default.value).upper()
        try:
            protocol = Protocol(raw)
        except ValueError:
            known = ", ".join(p.value for p in Protocol)
            raise ConfigError(f"{ENV_PREFIX}SECURITY_PROTOCOL {raw!r}: unknown; use one of {known}") from None
        return cls(
            protocol=protocol,
            mechanism=(get("SASL_MECHANISM") or "SCRAM-SHA-512").upper(),
            username=username,
            password=Secret(password) if password else None,
            cafile=cafile,
            certfile=get("SSL_CERTFILE"),
            keyfile=get("SSL_KEYFILE"),
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """A verifying TLS context (the CA file, else the system's CAs; hostname checked), or None."""
        if not self.protocol.tls:
            return None
        context = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cafile=self.cafile)
        if self.certfile and self.keyfile:
            context.load_cert_chain(self.certfile, self.keyfile)
        return context

    def client_options(self) -> dict[str, Any]:
        """Keywords for AIOKafkaConsumer / AIOKafkaProducer / AIOKafkaAdminClient."""
        options: dict[str, Any] = {"security_protocol": self.protocol.value}
        context = self.ssl_context()
        if context is not None:
            options["ssl_context"] = context
        if self.protocol.sasl:
            assert self.password is not None  # __post_init__ requires a password with SASL
            options |= {
                "sasl_mechanism": self.mechanism,
                "sasl_plain_username": self.username,
                "sasl_plain_password": self.password.reveal(),
            }
        return options

    def faust_credentials(self) -> Any:
        """Faust's `broker_credentials` for the same settings (None for PLAINTEXT)."""
        import faust

        if self.protocol.sasl:
            assert self.password is not None  # __post_init__ requires a password with SASL
            return faust.SASLCredentials(
                username=self.username,
                password=self.password.reveal(),
                ssl_context=self.ssl_context(),
                mechanism=self.mechanism,
            )
        if self.protocol.tls:
            return faust.SSLCredentials(self.ssl_context())
        return None
