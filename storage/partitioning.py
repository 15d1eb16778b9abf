"""Which partition owns a key: a stable hash of the encoded key (never Python's salted
hash()), or, for tables that declare it, the integer key modulo the partition count."""

from __future__ import annotations

from typing import Mapping
from zlib import crc32


class Partitioner:
    def __init__(self, partitions: int, modulo_tables: frozenset[str] = frozenset()):
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.partitions = partitions
        self.modulo_tables = modulo_tables

    @classmethod
    def for_tables(cls, partitions: int, partitioners: Mapping[str, str]) -> "Partitioner":
        return cls(partitions, frozenset(t for t, kind in partitioners.items() if kind == "modulo"))

    def of(self, table: str, key: int | str, encoded: bytes) -> int:
        n = self.partitions
        if n == 1:
            return 0
        if table in self.modulo_tables and type(key) is int:
            return key % n
        return crc32(encoded) % n


def place(partitioner: Partitioner, reads: tuple[bytes, ...], read_set, writes: dict[bytes, tuple]
          ) -> tuple[tuple[int, ...], tuple[int, ...], dict[bytes, int]]:
    """Where a transaction runs, computed in this one place for the sequencer and the
    workers alike: its participants (partitions holding any of its keys, ascending), its
    active participants (those it writes; its lowest participant if it writes nothing),
    and the partition of each key. `reads` are the encoded keys of `read_set`; `writes`
    maps each encoded written key to its (table, key)."""
    of = partitioner.of
    placed = {encoded: of(table, key, encoded) for encoded, (table, key) in zip(reads, read_set)}
    writers = set()
    for encoded, (table, key) in writes.items():
        p = placed.get(encoded)
        if p is None:
            p = placed[encoded] = of(table, key, encoded)
        writers.add(p)
    participants = tuple(sorted(set(placed.values())))
    return participants, tuple(sorted(writers)) or participants[:1], placed
