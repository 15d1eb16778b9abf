"""Which partition owns a key: a stable hash of the encoded key (never Python's salted
hash()), or, for tables that declare it, the integer key modulo the partition count, or
one component of a composite key (an integer modulo the count, a string by its hash)."""

from __future__ import annotations

from typing import Mapping
from zlib import crc32

from ordo.storage.keys import KeyRange, encode_key


class Partitioner:
    def __init__(
        self,
        partitions: int,
        modulo_tables: frozenset[str] = frozenset(),
        component_tables: Mapping[str, int] | None = None,
    ):
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.partitions = partitions
        self.modulo_tables = modulo_tables
        self.component_tables = dict(component_tables or {})

    @classmethod
    def for_tables(cls, partitions: int, partitioners: Mapping[str, str]) -> "Partitioner":
        components = {
            t: int(kind.partition(":")[2]) for t, kind in partitioners.items() if kind.startswith("component:")
        }
        return cls(partitions, frozenset(t for t, kind in partitioners.items() if kind == "modulo"), components)

    def of(self, table: str, key: int | str | tuple, encoded: bytes) -> int:
        n = self.partitions
        if n == 1:
            return 0
        if table in self.modulo_tables and type(key) is int:
            return key % n
        if self.component_tables and table in self.component_tables:
            return self._by_component(table, key, n)
        return crc32(encoded) % n

    def of_key(self, table: str, key: int | str | tuple) -> int:
        """`of` for a key not encoded yet: it is encoded only if its table hashes."""
        n = self.partitions
        if n == 1:
            return 0
        if table in self.modulo_tables and type(key) is int:
            return key % n
        if self.component_tables and table in self.component_tables:
            return self._by_component(table, key, n)
        return crc32(encode_key(table, key)) % n

    def of_prefix(self, table: str, prefix: tuple) -> int | None:
        """The one partition that holds every key of `table` starting with `prefix`, where
        the table places keys by a component the prefix includes; else None."""
        index = self.component_tables.get(table)
        if self.partitions == 1:
            return 0
        if index is None or index >= len(prefix):
            return None
        return self._by_component(table, tuple(prefix), self.partitions)

    def _by_component(self, table: str, key, n: int) -> int:
        index = self.component_tables[table]
        if type(key) is KeyRange:  # a declared range lies where its keys do
            key = key.components
        if type(key) is tuple and index < len(key):
            component = key[index]
            if type(component) is int:
                return component % n
            return crc32(component.encode()) % n
        return crc32(encode_key(table, key)) % n  # a key without that component: hashed whole


NO_KEYS = (0,)


def place(partitioner: Partitioner, read_set, write_set) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Where a transaction runs, computed in this one place for the sequencer and the
    workers alike: its participants (partitions holding any of its keys, ascending) and
    its active participants (those it writes; its lowest participant if it writes nothing)."""
    of = partitioner.of_key
    writers = {of(table, key) for table, key in write_set}
    participants = tuple(sorted(writers.union(of(table, key) for table, key in read_set)))
    if not participants:
        # No keys: no partition's data is involved, yet RUN decides an outcome. Partition
        # 0 runs it, as a single-partition transaction on every layout.
        return NO_KEYS, NO_KEYS
    return participants, tuple(sorted(writers)) or participants[:1]


def executor_of(index: int, active: tuple[int, ...]) -> int:
    """The active participant that runs a multi-partition transaction's RUN and reports its
    outcome: spread over the active participants by log position, so no partition runs
    every one."""
    return active[index % len(active)]


def owned_keys(
    partitioner: Partitioner, participants: tuple[int, ...], read_set, write_set
) -> dict[int, tuple[list[bytes], list[bytes], list[bytes]]]:
    """Each participant's own keys, encoded, in declared order, as (read only, read and
    written, written only), from sets as `Registry.analyze` gives them (no pair twice).
    Keys are integers, strings or tuples of them, so equal pairs are the pairs that
    encode alike, and each key is encoded once."""
    of = partitioner.of
    owned: dict[int, tuple[list[bytes], list[bytes], list[bytes]]] = {p: ([], [], []) for p in participants}
    if read_set == write_set:  # read-modify-write, the common case: no pair to look up
        for table, key in read_set:
            encoded = encode_key(table, key)
            owned[of(table, key, encoded)][1].append(encoded)
        return owned
    written = set(write_set)
    for pair in read_set:
        table, key = pair
        encoded = encode_key(table, key)
        owned[of(table, key, encoded)][1 if pair in written else 0].append(encoded)
    read = set(read_set)
    for pair in write_set:
        if pair not in read:
            table, key = pair
            encoded = encode_key(table, key)
            owned[of(table, key, encoded)][2].append(encoded)
    return owned
