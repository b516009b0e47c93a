"""The ledger on a Redis with TLS and ACL users (certificates made here with the openssl CLI): it works
as a dedicated least-privilege user configured from the URL or the environment, and no password is
ever printed (errors, CLI output, exception messages)."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from dpstream.topology.errors import ConfigError
from dpstream.workers.ledger import LedgerUnavailable, Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.connection import LedgerAddress, redact
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology
from dpstream.workers.localstack import free_port
from dpstream.workers.localstack.redis_secure import NodeSecurity, SecureRedisHandle, TlsFiles, make_certificates
from dpstream.workers.localstack.sentinel import SentinelLedger

DAY = 86_400
NOW = 1_796_000_000.0  # the ledger's pinned clock (2026-11-30): its windows are inside the idempotency horizon
P0 = int(NOW) // DAY * DAY
ADMIN_PASSWORD = "adm-" + secrets.token_urlsafe(18)
LEDGER_PASSWORD = "led-" + secrets.token_urlsafe(18)
WRONG_PASSWORD = "wrong-" + secrets.token_urlsafe(18)
SECRETS = (ADMIN_PASSWORD, LEDGER_PASSWORD, WRONG_PASSWORD)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureRedisHandle]:
    """A TLS-only redis-server (no plain port) with users admin and ledger, default user off."""
    base = tmp_path_factory.mktemp("secure-redis")
    tls = make_certificates(base / "tls")
    security = NodeSecurity(tls, admin_password=ADMIN_PASSWORD, ledger_password=LEDGER_PASSWORD)
    handle = SecureRedisHandle(free_port(), base / "data", security)
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """Certificates from a CA the server does not use."""
    return make_certificates(tmp_path_factory.mktemp("other-ca"))


def _admin(secure: SecureRedisHandle) -> redis.Redis:
    return redis.Redis(
        port=secure.port, username="admin", password=ADMIN_PASSWORD, ssl=True, ssl_ca_certs=str(secure.tls.ca)
    )


def _session(url: str) -> None:
    """Register, quote, charge, commit, operator actions, parking, reads: every ledger call a worker
    and the CLI make (so the ledger ACL user is known to allow each)."""

    async def body() -> None:
        ledger = await open_ledger(url, one_scope_topology(), clock=ManualClock(NOW))
        try:
            q = await ledger.quote("m", P0, P0 + DAY)
            req = ReleaseRequest(
                secrets.token_hex(8), "s", q.period_id, "m", P0, P0 + DAY, q.cost, b'{"ratio_after":null}'
            )
            charged = await ledger.charge(req)
            assert charged.outcome is Outcome.CHARGED
            assert await ledger.stored_payload("s", req.release_id) == charged.payload
            assert [p.release_id for p in await ledger.pending(0)] == [req.release_id]
            assert await ledger.commit("s", req.release_id)
            assert await ledger.version_schedule_start("v1", 100) == 100
            assert await ledger.open_breaker("s", "drill", "ops") and await ledger.close_breaker("s", "over", "ops")
            await ledger.grant_reserve("s", 0.01, "drill", "ops")
            assert await ledger.park("s", "stuck", "m", (DAY, 2 * DAY), 5, "ValueError", "worker")
            assert [p.release_id for p in await ledger.parked("s")] == ["stuck"]
            assert await ledger.retry_parked("s", None, "fixed", "ops") == 1
            await ledger.unpark("s", "stuck", "published", "worker")
            assert await ledger.audit("s")
            await ledger.status("s")
            await ledger.history("s")
            rows = (await ledger.reconcile("s")).periods
            assert rows and all(row.stored_units == row.audited_units for row in rows)
        finally:
            await ledger.close()

    asyncio.run(body())


def _env(secure: SecureRedisHandle, password: str) -> dict[str, str]:
    return _env_of(secure.security, password)


def _env_of(security: NodeSecurity, password: str) -> dict[str, str]:
    return {"DPSTREAM_REDIS_PASSWORD": password, "DPSTREAM_REDIS_CA_FILE": str(security.tls.ca)}


def test_ledger_user_over_tls_from_the_environment(secure: SecureRedisHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    """rediss://ledger@host with DPSTREAM_REDIS_PASSWORD and DPSTREAM_REDIS_CA_FILE: the whole ledger runs."""
    with _admin(secure) as admin:
        admin.flushall()
    for name, value in _env(secure, LEDGER_PASSWORD).items():
        monkeypatch.setenv(name, value)
    _session(secure.url)


def test_ledger_user_over_tls_from_the_url(secure: SecureRedisHandle) -> None:
    """The same with the password and CA file in the URL (a topology's redis.url); the URL's win over env."""
    with _admin(secure) as admin:
        admin.flushall()
    _session(f"rediss://ledger:{LEDGER_PASSWORD}@127.0.0.1:{secure.port}/0?ssl_ca_certs={secure.tls.ca}")


def test_ledger_user_has_least_privilege(secure: SecureRedisHandle, other_ca: TlsFiles) -> None:
    """The ledger user cannot flush, read keys outside dpstream:*, or change config; the default user
    is off; the plain-text port is closed; a server certificate from another CA is refused."""

    def tls_client(username: str | None = None, password: str | None = None) -> redis.Redis:
        return redis.Redis(
            port=secure.port, username=username, password=password, ssl=True, ssl_ca_certs=str(secure.tls.ca)
        )

    with tls_client("ledger", LEDGER_PASSWORD) as ledger_user:
        assert ledger_user.ping()
        for denied in (ledger_user.flushall, lambda: ledger_user.get("other:key"), lambda: ledger_user.keys("*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                denied()
        with pytest.raises(redis.exceptions.NoPermissionError):
            ledger_user.config_set("appendfsync", "no")
    with pytest.raises(redis.exceptions.AuthenticationError), tls_client() as anonymous:
        anonymous.ping()
    with pytest.raises(redis.exceptions.ConnectionError), redis.Redis(port=secure.port, socket_timeout=2) as plain:
        plain.ping()
    with pytest.raises(LedgerUnavailable, match="unavailable"):
        _session(f"rediss://ledger:{LEDGER_PASSWORD}@127.0.0.1:{secure.port}/0?ssl_ca_certs={other_ca.ca}")


def _cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """`dpstream ARGS` started in a child process (the runs go in parallel; `_done` collects one)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("DPSTREAM_REDIS")} | env
    argv = [sys.executable, "-m", "dpstream.workers.cli", *args]
    return subprocess.Popen(argv, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _done(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_no_secret_is_ever_printed(secure: SecureRedisHandle, other_ca: TlsFiles) -> None:
    """`dpstream budget status` (working, wrong password, wrong CA, plain scheme on the TLS port, missing
    CA file) and every exception's message carry no password; each failure is one line, no traceback."""
    with _admin(secure) as admin:
        admin.flushall()
    _session(f"rediss://ledger:{LEDGER_PASSWORD}@127.0.0.1:{secure.port}/0?ssl_ca_certs={secure.tls.ca}")
    other = other_ca
    in_url = f"rediss://ledger:{LEDGER_PASSWORD}@127.0.0.1:{secure.port}/0"
    cases = {  # run one after another: parallel TLS handshakes on a loaded 2-core machine time out
        "env": (["budget", "status", "--redis", secure.url], _env(secure, LEDGER_PASSWORD)),
        "url": (["budget", "status", "--json", "--redis", in_url + f"?ssl_ca_certs={secure.tls.ca}"], {}),
        "wrong password": (["budget", "status", "--redis", secure.url], _env(secure, WRONG_PASSWORD)),
        "other ca": (["budget", "status", "--redis", in_url + f"?ssl_ca_certs={other.ca}"], {}),
        "plain": (["budget", "status", "--redis", in_url.replace("rediss://", "redis://")], {}),
        "missing ca": (["budget", "status", "--redis", in_url + "?ssl_ca_certs=/nonexistent/ca.pem"], {}),
    }
    runs = {name: _done(_cli(*case)) for name, case in cases.items()}
    for name in ("env", "url"):
        assert runs[name].returncode == 0, (name, runs[name].stderr)
        assert "s" in runs[name].stdout
    for name in ("wrong password", "other ca", "plain", "missing ca"):
        run = runs[name]
        assert run.returncode in (1, 2), (name, run.returncode, run.stderr)  # 1 unavailable, 2 config
        assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr, (name, run.stderr)
        assert "127.0.0.1" in run.stderr  # the error names the server ...
    messages: list[str] = []
    for url in (in_url.replace(LEDGER_PASSWORD, WRONG_PASSWORD) + f"?ssl_ca_certs={secure.tls.ca}", in_url):
        with pytest.raises((LedgerUnavailable, ConfigError)) as caught:
            _session(url + ("" if "ssl_ca" in url else f"?ssl_ca_certs={other.ca}"))
        messages += [str(caught.value), repr(caught.value)]
    address = LedgerAddress.parse(in_url + f"&password={WRONG_PASSWORD}".replace("&", "?", 1))
    messages += [repr(address), address.display, redact(in_url), redact(in_url + f"?password={WRONG_PASSWORD}")]
    shown = [run.stdout + run.stderr for run in runs.values()] + messages
    leaked = [(i, s) for i, text in enumerate(shown) for s in SECRETS if s in text]
    assert not leaked, f"a password was printed: output #{leaked[0][0]}"  # ... never its password


def test_sentinel_group_with_acl_and_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Primary, replica and sentinel all TLS-only with ACL users (replication as `replica`, Sentinel as
    `sentinel`): the ledger user runs the whole ledger through rediss+sentinel://, its charges
    confirmed by WAIT; Sentinel fails over with its own user, the old primary rejoins as `replica`,
    and the ledger runs again on the promoted node."""
    base = tmp_path
    security = NodeSecurity(make_certificates(base / "tls"), ADMIN_PASSWORD, LEDGER_PASSWORD)
    group = SentinelLedger(base, replicas=1, sentinels=1, security=security)
    for name, value in {"DPSTREAM_REDIS_USERNAME": "ledger", **_env_of(security, LEDGER_PASSWORD)}.items():
        monkeypatch.setenv(name, value)
    group.start()
    try:
        assert group.url.startswith("rediss+sentinel://")
        _session(group.url + "?min_replicas=1")
        old = group.primary()
        old.kill()
        group.wait_failover(old.port)
        old.start()
        group.wait_replicas(1)
        with redis.Redis(port=group.primary().port, **security.admin_kwargs()) as admin:
            admin.flushall()
        _session(group.url + "?min_replicas=1")
    finally:
        group.stop()
