"""Tests of the Kafka client security settings (workers/runtime/kafka_security.py)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.workers.runtime.kafka_security import KafkaSecurity, Protocol, Secret

P = "DPSTREAM_KAFKA_"
SECRET = "pw-SECRET-1"


def test_no_environment_is_plaintext() -> None:
    """Without variables every client connects in plaintext with no SASL keywords."""
    security = KafkaSecurity.from_env({})
    assert security.protocol is Protocol.PLAINTEXT
    assert security.client_options() == {"security_protocol": "PLAINTEXT"}
    assert security.faust_credentials() is None


def test_a_user_means_sasl_ssl_and_the_password_never_prints(tmp_path: Path) -> None:
    """A SASL user defaults to SASL_SSL over a verifying TLS context; repr and str hide the password."""
    env = {P + "SASL_USERNAME": "worker", P + "SASL_PASSWORD": "s3cr3t-value"}
    security = KafkaSecurity.from_env(env)
    assert security.protocol is Protocol.SASL_SSL
    options = security.client_options()
    assert options["sasl_mechanism"] == "SCRAM-SHA-512" and options["sasl_plain_password"] == "s3cr3t-value"
    assert options["ssl_context"].verify_mode == ssl.CERT_REQUIRED and options["ssl_context"].check_hostname
    assert "s3cr3t-value" not in repr(security) + str(security) + repr(security.password) + str(security.password)
    credentials = security.faust_credentials()
    assert credentials.username == "worker" and "s3cr3t-value" not in repr(credentials)


def test_password_file_is_read(tmp_path: Path) -> None:
    """DPSTREAM_KAFKA_SASL_PASSWORD_FILE supplies the password (a trailing newline dropped)."""
    (tmp_path / "pw").write_text("from-file\n")
    env = {P + "SASL_USERNAME": "w", P + "SASL_PASSWORD_FILE": str(tmp_path / "pw")}
    assert KafkaSecurity.from_env(env).password == Secret("from-file")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({P + "SECURITY_PROTOCOL": "SASL_SSL"}, r"SECURITY_PROTOCOL SASL_SSL: needs a user; set DPSTREAM_KAFKA_SASL_"),
        ({P + "SECURITY_PROTOCOL": "TLS"}, r"SECURITY_PROTOCOL 'TLS': unknown; use one of PLAINTEXT, SSL"),
        ({P + "SASL_USERNAME": "w", P + "SASL_PASSWORD": SECRET, P + "SASL_MECHANISM": "md5"}, r"'MD5': unsupported"),
        ({P + "SASL_USERNAME": "w", P + "SASL_PASSWORD": SECRET, P + "SECURITY_PROTOCOL": "SSL"}, r"use SASL_SSL"),
        ({P + "SSL_CAFILE": "/nonexistent/ca.pem"}, r"SSL_CAFILE /nonexistent/ca.pem: no such file"),
        ({P + "SSL_CERTFILE": "/x", P + "SECURITY_PROTOCOL": "SSL"}, r"SSL_CERTFILE and DPSTREAM_KAFKA_SSL_KEYFILE"),
        ({P + "SASL_USERNAME": "w", P + "SASL_PASSWORD_FILE": "/nonexistent/pw"}, r"PASSWORD_FILE /nonexistent/pw"),
    ],
)
def test_mistakes_are_one_line_without_the_password(env: dict[str, str], message: str) -> None:
    """Each mistake is one ConfigError line naming the variable and the fix; no password in it."""
    with pytest.raises(ConfigError, match=message) as info:
        KafkaSecurity.from_env(env)
    assert "\n" not in str(info.value) and SECRET not in str(info.value)


def test_topology_kafka_section_is_the_fallback_and_the_environment_wins(tmp_path: Path) -> None:
    """`kafka:` in the topology gives protocol, user and CA; a DPSTREAM_KAFKA_* variable set overrides it."""
    from dpstream.topology.model import KafkaProtocol, KafkaSettings

    (tmp_path / "ca.pem").write_text("not read here")
    kafka = KafkaSettings("b:9093", KafkaProtocol.SASL_SSL, "SCRAM-SHA-256", "from-file", str(tmp_path / "ca.pem"))
    security = KafkaSecurity.from_env({P + "SASL_PASSWORD": SECRET}, kafka=kafka)
    assert (security.protocol, security.mechanism, security.username) == (
        Protocol.SASL_SSL,
        "SCRAM-SHA-256",
        "from-file",
    )
    assert security.cafile == str(tmp_path / "ca.pem")
    env = {P + "SASL_PASSWORD": SECRET, P + "SASL_USERNAME": "from-env", P + "SASL_MECHANISM": "SCRAM-SHA-512"}
    security = KafkaSecurity.from_env(env, kafka=kafka)
    assert (security.username, security.mechanism) == ("from-env", "SCRAM-SHA-512")


TOPOLOGY = """\
version: 1
kafka:
{kafka}
sources:
  clicks: {{topic: web.clicks, privacy_unit: user_id}}
budgets:
  daily: {{epsilon: 1.0, delta: 1.0e-6, period: 1d}}
metrics:
  m1: {{source: clicks, budget: daily, window: {{tumbling: 1m}}, aggregate: count, mechanism: gaussian}}
sinks: {{releases: out.releases, dead_letter: out.dlq}}
"""


def _kafka(*lines: str) -> str:
    return TOPOLOGY.format(kafka="\n".join("  " + line for line in lines))


def test_topology_kafka_security_fields_load_and_round_trip() -> None:
    """`kafka:` takes security_protocol, sasl_mechanism, sasl_username and ssl_cafile; dump keeps them."""
    from dpstream.topology.dumper import dump_topology
    from dpstream.topology.loader import load_topology_text
    from dpstream.topology.model import KafkaProtocol, KafkaSettings

    text = _kafka(
        "bootstrap: k1:9093", "security_protocol: SASL_SSL", "sasl_mechanism: SCRAM-SHA-256",
        "sasl_username: dpstream-worker", "ssl_cafile: /etc/dpstream/kafka-ca.pem",
    )  # fmt: skip
    topology = load_topology_text(text, env={})
    want = KafkaSettings(
        "k1:9093", KafkaProtocol.SASL_SSL, "SCRAM-SHA-256", "dpstream-worker", "/etc/dpstream/kafka-ca.pem"
    )
    assert topology.kafka == want
    assert load_topology_text(dump_topology(topology), env={}).kafka == want


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (f"sasl_password: {SECRET}", r"t.yaml:4: kafka: sasl_password: a secret does not belong in the topology "
         r"file; set DPSTREAM_KAFKA_SASL_PASSWORD"),
        ("security_protocol: SASL_TLS", r"t.yaml:4: kafka: security_protocol 'SASL_TLS': unknown security_protocol; "
         r"did you mean 'SASL_SSL'\?"),
        ("sasl_mechanism: GSSAPI", r"t.yaml:4: kafka: sasl_mechanism 'GSSAPI': unsupported; use one of SCRAM-SHA-512"),
    ],
)  # fmt: skip
def test_topology_kafka_mistakes_are_one_line(line: str, message: str) -> None:
    """A password in the file, an unknown protocol or mechanism: one located line (never the secret)."""
    from dpstream.topology.loader import load_topology_text
    from dpstream.topology.validation import TopologyError

    with pytest.raises(TopologyError, match=message) as info:
        load_topology_text(_kafka("bootstrap: k1:9093", line), path="t.yaml", env={})
    assert "\n" not in str(info.value) and SECRET not in str(info.value)
