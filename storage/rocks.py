"""The RocksDB backend: one shard per partition, raw bytes keys and values."""

from __future__ import annotations

import os
from typing import Any, Iterator

import msgpack
from rocksdict import AccessType, Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from ordo.storage.digest import digest_pairs
from ordo.storage.keys import META_PREFIX, meta_key, table_prefix

APPLIED = meta_key("applied")
# Debug hook for crash tests (ORDO_TRACE_APPLIED=1): each applied batch also bumps a
# per-batch counter in the same WriteBatch, so a test can prove every batch reached the
# state it survives in exactly once, across crashes, restores and replays.
TRACE_PREFIX = meta_key("trace/")


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.increase_parallelism(2)
    # A batch is a multi-get of the keys it reads and one WriteBatch: point lookups, many
    # of absent keys. Bloom filters, a block cache, hashed data-block indexes and small
    # memtables (shallow skip lists; flushed data is filtered) cut the storage CPU per key
    # by about a third on the micro workload (measured against the defaults).
    options.optimize_for_point_lookup(64)
    options.set_write_buffer_size(4 << 20)
    return options


_MEMORY_PROPERTIES = (
    ("block_cache", "rocksdb.block-cache-usage"),
    ("memtables", "rocksdb.cur-size-all-mem-tables"),
    ("table_readers", "rocksdb.estimate-table-readers-mem"),
)


class ShardCorrupt(RuntimeError):
    """RocksDB found a shard's files damaged: a block whose checksum does not match, a file
    cut short. What the shard holds can no longer be trusted."""

    def __init__(self, path: str, detail: str):
        self.path = path
        self.detail = detail
        super().__init__(f"shard {path} is corrupt: {detail}")


class ShardUnwritable(RuntimeError):
    """RocksDB cannot write a shard (its disk is full, its directory read-only): the engine
    cannot go on until the operator makes room, and then resumes from the log."""

    def __init__(self, path: str, detail: str):
        self.path = path
        self.detail = detail
        super().__init__(
            f"cannot write shard {path}: {detail}; free space on (or give write access to) its disk, "
            f"then start again: the engine resumes from the log"
        )

    def __reduce__(self):  # it crosses from a Ray worker to the engine whole
        return type(self), (self.path, self.detail)


def _detail(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _failure(path: str, exc: Exception) -> RuntimeError:
    """What a RocksDB error means for a shard. rocksdict raises a bare Exception whose
    text is RocksDB's status ("Corruption: …", "IO error: …")."""
    detail = _detail(exc)
    if detail.startswith("Corruption"):
        return ShardCorrupt(path, detail)
    return RuntimeError(f"shard {path} cannot be read: {detail}")


def _write_failure(path: str, exc: Exception) -> RuntimeError:
    detail = _detail(exc)
    if detail.startswith("Corruption"):
        return ShardCorrupt(path, detail)
    return ShardUnwritable(path, detail)


def _scan_options() -> ReadOptions:
    options = ReadOptions()
    # The default, made explicit: a scan must never report a block that fails its checksum.
    options.set_verify_checksums(True)
    return options


class RocksShard:
    """A RocksDB shard. `read_only=True` opens a consistent view of a shard that another
    process may be writing (used by dump and digest while the engine runs)."""

    def __init__(self, path: str, read_only: bool = False, sync: bool = False):
        self.path = path
        if read_only:
            if not os.path.isdir(path):
                raise FileNotFoundError(f"no shard at {path}")
            try:
                self._db = Rdict(path, _options(), access_type=AccessType.read_only())
            except Exception as exc:
                raise _failure(path, exc) from None
        else:
            try:
                os.makedirs(path, exist_ok=True)
                self._db = Rdict(path, _options())
            except OSError as exc:
                raise ShardUnwritable(path, exc.strerror or str(exc)) from None
            except Exception as exc:
                raise _write_failure(path, exc) from None
        self._write_failed: RuntimeError | None = None
        self._write_options = WriteOptions()
        # Without sync, an applied batch survives a process crash (the WAL is in the OS
        # page cache) but not a power loss; sync=True buys the latter per batch.
        self._write_options.sync = sync
        self._trace = not read_only and os.environ.get("ORDO_TRACE_APPLIED") == "1"

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        return self._db.get(keys)

    def apply_batch(self, writes: dict[bytes, bytes | None], marker: dict[str, Any], first: int | None = None) -> None:
        """Apply `writes` and `marker` in one atomic write: the state after batch
        marker["batch"], and (a round, scheduler/round.py) after every batch from `first`."""
        batch = WriteBatch(raw_mode=True)
        for key, value in writes.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        batch.put(APPLIED, msgpack.packb(marker))
        if self._trace:
            for applied in range(marker["batch"] if first is None else first, marker["batch"] + 1):
                key = TRACE_PREFIX + b"%012d" % applied
                count = self._db.get(key)
                batch.put(key, msgpack.packb(1 if count is None else msgpack.unpackb(count) + 1))
        try:
            self._db.write(batch, self._write_options)
        except Exception as exc:
            self._write_failed = _write_failure(self.path, exc)
            raise self._write_failed from None

    def read_applied(self, keys: list[bytes]) -> tuple[dict[str, Any] | None, list[bytes | None]]:
        """The applied marker and `keys`' values, from one view of the shard: RocksDB's
        multi-get reads every key at one sequence number, so the values are exactly those
        of the batch the marker names, whatever is being applied meanwhile."""
        try:
            raw = self._db.get([APPLIED, *keys])
        except Exception as exc:
            raise _failure(self.path, exc) from None
        marker = None if raw[0] is None else msgpack.unpackb(raw[0], strict_map_key=False)
        return marker, raw[1:]

    def scan_applied(
        self, prefix: bytes, after: bytes | None, limit: int
    ) -> tuple[dict[str, Any] | None, list[tuple[bytes, bytes]], bool]:
        """The applied marker and up to `limit` records whose keys start with `prefix` (past
        `after`, if given), in key order, from one view of the shard (an iterator reads at
        the sequence number it was made at); and whether more follow."""
        it = self._db.iter(_scan_options())
        it.seek(APPLIED)
        raw = it.value() if it.valid() and it.key() == APPLIED else None
        marker = None if raw is None else msgpack.unpackb(raw, strict_map_key=False)
        it.seek(prefix if after is None else after + b"\x00")
        rows: list[tuple[bytes, bytes]] = []
        more = False
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                break
            if len(rows) == limit:
                more = True
                break
            rows.append((key, it.value()))
            it.next()
        self._check(it)
        return marker, rows, more

    def applied(self) -> dict[str, Any] | None:
        try:
            raw = self._db.get(APPLIED)
        except Exception as exc:
            raise _failure(self.path, exc) from None
        return None if raw is None else msgpack.unpackb(raw, strict_map_key=False)

    def applied_trace(self) -> dict[int, int]:
        """Batch id -> times applied, as recorded under ORDO_TRACE_APPLIED=1."""
        trace = {}
        it = self._db.iter(_scan_options())
        it.seek(TRACE_PREFIX)
        while it.valid() and it.key().startswith(TRACE_PREFIX):
            trace[int(it.key()[len(TRACE_PREFIX) :])] = msgpack.unpackb(it.value())
            it.next()
        self._check(it)
        return trace

    def items(self, table: str | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Every record, or a table's, in key order. An iterator that stops on an error
        looks just like one at the end, so its status is checked: a damaged shard raises
        ShardCorrupt instead of ending the scan short."""
        it = self._db.iter(_scan_options())
        if table is None:
            it.seek_to_first()
            # Metadata sorts first (leading 0x00): skip past it.
            while it.valid() and it.key().startswith(META_PREFIX):
                it.next()
            while it.valid():
                yield it.key(), it.value()
                it.next()
        else:
            prefix = table_prefix(table)
            it.seek(prefix)
            while it.valid():
                key = it.key()
                if not key.startswith(prefix):
                    return
                yield key, it.value()
                it.next()
        self._check(it)

    def table_names(self) -> Iterator[str]:
        """The tables this shard holds records of, in name order: one seek per table, not a
        scan of its records."""
        it = self._db.iter(_scan_options())
        it.seek(b"\x01")  # past the metadata (leading 0x00)
        while it.valid():
            name = it.key().split(b"\x00", 1)[0]
            yield name.decode()
            it.seek(name + b"\x01")  # every key of the table starts with name + 0x00
        self._check(it)

    def prefix_items(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The records whose keys start with `prefix`, in key order."""
        it = self._db.iter(_scan_options())
        it.seek(prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                break
            yield key, it.value()
            it.next()
        self._check(it)

    def _check(self, it) -> None:
        try:
            it.status()  # raises RocksDB's error, if the iterator stopped on one
        except Exception as exc:
            raise _failure(self.path, exc) from None

    def memory(self) -> dict[str, int]:
        """What RocksDB holds in memory for this shard, in bytes: the block cache (bounded by
        its capacity), the memtables (bounded by the write buffers) and the table readers'
        indexes and filters (growing with the data on disk)."""
        value = self._db.property_int_value
        try:
            return {kind: value(name) or 0 for kind, name in _MEMORY_PROPERTIES}
        except Exception:  # a closed shard
            return {}

    def digest(self) -> int:
        return digest_pairs(self.items())

    def checkpoint(self, path: str) -> None:
        from rocksdict import Checkpoint

        try:
            Checkpoint(self._db).create_checkpoint(path)
        except Exception as exc:
            raise _write_failure(path, exc) from None

    def close(self) -> None:
        try:
            self._db.close()  # flushes the memtable: a full disk shows here too
        except Exception as exc:
            # After a failed write RocksDB only says "Writer has previous error": the first
            # failure is the one that says what happened.
            raise (self._write_failed or _write_failure(self.path, exc)) from None

    def __enter__(self) -> "RocksShard":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
