"""The ledger contract suite, unchanged, against a Redis Cluster of three local primaries: every key of a
scope shares its hash tag, so each script (and each MULTI) runs on one slot of one node."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_ledger_contract as contract  # the suite itself (pytest puts this directory on sys.path)

from dpstream.topology.errors import ConfigError
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.testing import one_scope_topology
from dpstream.workers.localstack.cluster import RedisClusterGroup

for _name, _test in vars(contract).items():  # every contract test that runs on the `where` fixture
    if _name.startswith("test_") and "where" in inspect.signature(_test).parameters:
        globals()[_name] = _test


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterGroup]:
    """Three cluster primaries (AOF, fsync always), slots spread by `redis-cli --cluster create`."""
    group = RedisClusterGroup(Path(tmp_path_factory.mktemp("cluster")), primaries=3)
    group.start()
    try:
        yield group
    finally:
        group.stop()


@pytest.fixture
def where(cluster: RedisClusterGroup) -> str:
    """The contract suite's ledger location, here the emptied cluster."""
    cluster.flush()
    return cluster.url


def test_cluster_refuses_a_replica_wait(cluster: RedisClusterGroup) -> None:
    """min_replicas > 0 cannot be honoured on a Cluster (WAIT is per node): a one-line ConfigError."""
    with pytest.raises(ConfigError, match=r"min_replicas=1: the ledger cannot WAIT on a Redis Cluster"):
        asyncio.run(open_ledger(cluster.url + "?min_replicas=1", one_scope_topology()))
