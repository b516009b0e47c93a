"""The session Redis fixture is a real, durable Redis: writes round-trip and survive a SIGKILL."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dpstream.workers.localstack import RedisHandle, free_port


def test_set_get_round_trip(fresh_redis) -> None:
    """A value written with SET comes back byte-identical from GET."""
    with fresh_redis.client() as client:
        assert client.set("dpstream:test:k", b"\x00value\xff") is True
        assert client.get("dpstream:test:k") == b"\x00value\xff"
        assert client.dbsize() == 1


def test_own_server_fsyncs_every_write(redis_server) -> None:
    """Our own server runs with AOF on and appendfsync always (the ledger's durability precondition)."""
    if os.environ.get("DPSTREAM_TEST_REDIS"):
        pytest.skip("external Redis: its config is not ours")
    with redis_server.client(decode_responses=True) as client:
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("save") == {"save": ""}


def test_acknowledged_write_survives_sigkill(tmp_path: Path) -> None:
    """A write acknowledged before a SIGKILL is there after restart on the same AOF."""
    handle = RedisHandle(free_port(), tmp_path / "redis")
    handle.start()
    try:
        import redis

        with redis.Redis.from_url(handle.url) as client:
            client.incrby("dpstream:{scope}:spent", 7)
            client.incrby("dpstream:{scope}:spent", 5)
        first_pid = handle.pid
        assert handle.kill() is True
        assert not handle.is_running()
        assert handle.start() is True
        assert handle.pid != first_pid
        with redis.Redis.from_url(handle.url) as client:
            assert client.get("dpstream:{scope}:spent") == b"12"
    finally:
        handle.stop()
    assert not handle.is_running()
