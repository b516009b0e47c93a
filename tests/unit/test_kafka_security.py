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
