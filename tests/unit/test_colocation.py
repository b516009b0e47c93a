"""workers.pipeline.colocation: the clients' own key → partition hashes (murmur2 as Java, crc32 as librdkafka)."""

from __future__ import annotations

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from dpstream.topology.model import Partitioner
from dpstream.workers.pipeline.colocation import (
    crc32_partition,
    home_partition,
    murmur2,
    murmur2_partition,
    partition_of,
)

JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}
"""Kafka's own test vectors of `Utils.murmur2` (UtilsTest.testMurmur2), as Java's signed ints."""


def test_murmur2_matches_the_java_clients_test_vectors():
    """Each vector of Kafka's UtilsTest hashes to the same 32 bits (signed there, unsigned here)."""
    for key, signed in JAVA_MURMUR2.items():
        assert murmur2(key) == signed % (1 << 32), key


@given(st.binary(max_size=80))
def test_murmur2_matches_aiokafkas(key: bytes):
    """Every byte string, of every length mod 4, hashes as aiokafka's murmur2 does."""
    assert murmur2(key) == aiokafka_murmur2(key)


@given(st.binary(min_size=1, max_size=40), st.integers(1, 64))
def test_murmur2_partition_is_aiokafkas_default_partitioner(key: bytes, partitions: int):
    """The murmur2 partition of a keyed record is the one aiokafka's default partitioner picks."""
    every = list(range(partitions))
    assert murmur2_partition(key, partitions) == DefaultPartitioner()(key, every, every)


def test_crc32_partition_is_the_standard_crc32_mod_the_count():
    """librdkafka's rd_crc32 is the standard CRC-32 (check value of "123456789": 0xCBF43926)."""
    assert crc32_partition(b"123456789", 1 << 32) == 0xCBF43926
    assert crc32_partition(b"123456789", 7) == 0xCBF43926 % 7


@given(st.binary(min_size=1, max_size=40), st.integers(1, 64))
def test_home_partition_answers_as_partition_of_for_both_partitioners(key: bytes, partitions: int):
    """The remembered per-topic function gives the same partition as the direct one, asked twice."""
    for partitioner in Partitioner:
        home = home_partition(partitioner, partitions)
        want = partition_of(key, partitions, partitioner)
        assert home(key) == want == home(key)
        assert 0 <= want < partitions


def test_home_partition_forgets_keys_beyond_its_limit_and_still_answers(monkeypatch: pytest.MonkeyPatch):
    """Past its limit the memory is cleared, never grown, and answers stay right."""
    from dpstream.workers.pipeline import colocation

    monkeypatch.setattr(colocation, "_CACHE_LIMIT", 3)
    home = home_partition(Partitioner.MURMUR2, 5)
    keys = [f"u{i}".encode() for i in range(10)]
    assert [home(k) for k in keys] == [murmur2_partition(k, 5) for k in keys]


def test_home_partition_refuses_a_topic_without_partitions():
    """A count below 1 is a bug upstream (the count is read from the topic): refused, not a modulo by zero."""
    with pytest.raises(ValueError, match="at least 1 partition"):
        home_partition(Partitioner.CRC32, 0)
