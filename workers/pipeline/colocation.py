"""Which partition a record keyed by its privacy unit belongs in, under the source's partitioner.

Bounding is global per unit only if all of a unit's records reach one pipeline. For a
`keyed_by_unit` source the worker checks that the Kafka key is the unit (`key_mismatch`) and that
the record sits in the partition its key hashes to (`wrong_partition`); a record elsewhere (a
producer that names partitions, or a client with another partitioner) would let one unit be
bounded once per partition. The hashes are the clients' own:

- `murmur2`: Kafka's Java `Utils.toPositive(Utils.murmur2(key)) % partitions`, also aiokafka's and
  kafka-python's default and librdkafka's `murmur2_random`;
- `crc32`: librdkafka's `consistent` / `consistent_random` (its default for keyed records):
  `rd_crc32(key) % partitions`, the standard CRC-32 (zlib's).
"""

from __future__ import annotations

__all__ = ["murmur2", "crc32_partition", "murmur2_partition", "partition_of", "home_partition"]

import struct
import zlib
from collections.abc import Callable

from dpstream.topology.model import Partitioner

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF

_CACHE_LIMIT = 1 << 16
"""Keys remembered per `home_partition` function before it forgets them all (memory stays bounded)."""


def murmur2(data: bytes) -> int:
    """32-bit MurmurHash2 as Kafka's Java client computes it (seed 0x9747b28c), unsigned.

    >>> murmur2(b"21")  # Java's Utils.murmur2("21".getBytes()) is -973932308, i.e. this unsigned
    3321034988
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK
    n4 = length // 4
    for k in struct.unpack_from(f"<{n4}I", data):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length - 4 * n4
    if tail:
        rest = data[4 * n4 :]
        if tail == 3:
            h ^= rest[2] << 16
        if tail >= 2:
            h ^= rest[1] << 8
        h = ((h ^ rest[0]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The Java client's default partition of a keyed record: toPositive(murmur2(key)) % partitions."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def crc32_partition(key: bytes, partitions: int) -> int:
    """librdkafka's `consistent` partition of a keyed record: crc32(key) % partitions."""
    return zlib.crc32(key) % partitions


_PARTITION_OF: dict[Partitioner, Callable[[bytes, int], int]] = {
    Partitioner.MURMUR2: murmur2_partition,
    Partitioner.CRC32: crc32_partition,
}


def partition_of(key: bytes, partitions: int, partitioner: Partitioner) -> int:
    """The partition a record with Kafka key `key` belongs in on a topic of `partitions` partitions."""
    return _PARTITION_OF[partitioner](key, partitions)


class _HomePartitions(dict[bytes, int]):
    """key → partition, filled on first use; a hit is a plain dict lookup (no Python call)."""

    def __init__(self, compute: Callable[[bytes, int], int], partitions: int) -> None:
        super().__init__()
        self._compute = compute
        self._partitions = partitions

    def __missing__(self, key: bytes) -> int:
        if len(self) >= _CACHE_LIMIT:
            self.clear()
        p = self[key] = self._compute(key, self._partitions)
        return p


def home_partition(partitioner: Partitioner, partitions: int) -> Callable[[bytes], int]:
    """`partition_of` for one topic, for the hot path: keys repeat (a unit has many records), so
    each key's partition is computed once and remembered (up to `_CACHE_LIMIT` keys, then forgotten
    together). Pure-Python murmur2 costs ≈ 1.2 µs for an 11-byte key; a remembered key is one dict
    lookup (the mapping's `__getitem__`)."""
    if partitions < 1:
        raise ValueError(f"a topic has at least 1 partition, not {partitions}")
    return _HomePartitions(_PARTITION_OF[partitioner], partitions).__getitem__
