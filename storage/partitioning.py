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
