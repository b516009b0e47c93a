"""The ledger URL (workers/ledger/connection.py): schemes, env settings, one-line errors, no secret shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_topology_text
from dpstream.workers.ledger.connection import LedgerAddress, redact
from dpstream.workers.ledger.durability import replica_problem

SECRET = "s3cr3t-pw"
SEED = Path(__file__).parents[2] / "topology" / "examples" / "seed-adaptive.yaml"


def test_sentinel_url() -> None:
    """Sentinels, master name, db and our own query parameters are read; nothing of ours reaches redis-py."""
    a = LedgerAddress.parse(
        "redis+sentinel://10.0.0.1:26379,[::1]:26380/ledger/2?min_replicas=2&wait_timeout_ms=500", env={}
    )
    assert (a.sentinel, a.cluster, a.tls) == (True, False, False)
    assert a.sentinels == (("10.0.0.1", 26379), ("::1", 26380))
    assert (a.service, a.db, a.min_replicas, a.wait_timeout_ms) == ("ledger", 2, 2, 500)


def test_direct_url_keeps_redis_py_parameters_and_drops_ours() -> None:
    """Unknown-to-us query parameters stay in the redis-py URL; min_replicas and namespace do not."""
    a = LedgerAddress.parse("redis://h:6379/0?namespace=blue&socket_keepalive=true&min_replicas=0", env={})
    assert a.direct_url == "redis://h:6379/0?socket_keepalive=true"
    assert (a.namespace, a.min_replicas) == ("blue", 0)


def test_environment_fills_what_the_url_leaves_out() -> None:
    """Password, user, min_replicas and namespace come from the environment unless the URL names them."""
    env = {
        "DPSTREAM_REDIS_PASSWORD": SECRET,
        "DPSTREAM_REDIS_USERNAME": "ledger",
        "DPSTREAM_REDIS_MIN_REPLICAS": "1",
        "DPSTREAM_LEDGER_NAMESPACE": "green",
    }
    a = LedgerAddress.parse("redis://h:1/0", env=env)
    assert (a.username, a.password, a.min_replicas, a.namespace) == ("ledger", SECRET, 1, "green")
    b = LedgerAddress.parse("redis://other:pw2@h:1/0?namespace=blue&min_replicas=0", env=env)
    assert (b.username, b.password, b.min_replicas, b.namespace) == ("other", "pw2", 0, "blue")
    assert a.min_replicas == 1 and LedgerAddress.parse("redis://h:1/0", env={}).min_replicas is None


def test_no_secret_in_display_repr_or_errors() -> None:
    """The display form, repr and every parse error leave the password (and the query) out."""
    url = f"rediss://ledger:{SECRET}@h:6380/0?password={SECRET}"
    a = LedgerAddress.parse(url, env={})
    assert SECRET not in a.display + repr(a) + redact(url)
    assert a.display == "rediss://ledger:***@h:6380/0"
    for bad in (
        f"redis://u:{SECRET}@h:1/0?min_replicas=many",
        f"http://u:{SECRET}@h:1/0",
        f"redis+sentinel://u:{SECRET}@h:1",
        f"redis+sentinel://u:{SECRET}@h/master",
        f"rediss://u:{SECRET}@h:1/0?ssl_ca_certs=/nonexistent/ca.pem",
        f"redis+cluster://u:{SECRET}@h:1/3",
        f"redis://u:{SECRET}@h:1/0?namespace=a:b",
    ):
        with pytest.raises(ConfigError) as caught:
            LedgerAddress.parse(bad, env={})
        assert SECRET not in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://h:1/0?min_replicas=-1", "min_replicas='-1': must be a whole number >= 0"),
        ("redis://h:1/0?wait_timeout_ms=0", "wait_timeout_ms='0': must be a whole number >= 1"),
        ("memcached://h:1", "scheme 'memcached': use redis://"),
        ("redis+sentinel://h:1", "no master name: write redis\\+sentinel://host:port"),
        ("redis+sentinel://h/m", "sentinel 'h': write each sentinel as host:port"),
        ("redis+cluster://h:1/2", "Redis Cluster has database 0 only"),
    ],
)
def test_url_errors_name_the_field_and_the_fix(url: str, message: str) -> None:
    """Each mistake in a ledger URL is one line naming the part and the fix."""
    with pytest.raises(ConfigError, match=message):
        LedgerAddress.parse(url, env={})


def test_replica_problem() -> None:
    """Warn when the WAIT can never be met, or confirms fewer replicas than a failover may promote."""
    assert replica_problem(1, 1) is None and replica_problem(0, 0) is None
    assert "every release fails closed" in (replica_problem(1, 0) or "")
    assert "may promote a replica that lacks" in (replica_problem(1, 2) or "")


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/dpstream/0?min_replicas=1",
        "rediss+sentinel://127.0.0.1:26379/dpstream",
        "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
        "rediss://ledger@127.0.0.1:6380/0?namespace=blue",
    ],
)
def test_topology_accepts_every_ledger_url(url: str) -> None:
    """A topology's `redis: url:` takes each ledger URL form that `--redis` takes."""
    text = Path(SEED).read_text(encoding="utf-8") + f"\nredis:\n  url: {url!r}\n"
    assert load_topology_text(text, "t.yaml").redis.url == url
    LedgerAddress.parse(url, env={})
