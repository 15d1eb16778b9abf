"""The per-batch write overlay: decoded values of the keys a batch touches. Reads of a
batch see the writes of earlier transactions of the same batch; aborted transactions
never reach it; at batch end it becomes one atomic write to the shard.

A batch may run while the batches before it wait for their outputs to be acknowledged,
not yet applied to the shard: its overlay then reads what they wrote (`unapplied`: key ->
(batch id, value) of the newest unapplied write) before it reads the shard."""

from __future__ import annotations

from typing import Any, Iterable

from ordo.storage.backend import StorageBackend
from ordo.storage.keys import is_range_key, range_scan_prefix
from ordo.storage.values import decode_value, encode_value


class _Absent:
    """The value of a key that holds none (never written, or deleted). One instance,
    which stays the same instance across pickling (values travel between processes)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"

    def __reduce__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


class RangeView:
    """What a transaction that declared a range reads it through, at its turn, while it
    holds the range's lock: any key in it, or all of its present keys in order."""

    __slots__ = ("_overlay", "prefix")

    def __init__(self, overlay: "BatchOverlay", range_key: bytes):
        self._overlay = overlay
        self.prefix = range_scan_prefix(range_key)

    def get(self, key: bytes) -> Any:
        return self._overlay.get(key)

    def items(self) -> list[tuple[bytes, Any]]:
        return self._overlay.range_items(self.prefix)


class BatchOverlay:
    __slots__ = ("_backend", "_values", "_dirty", "_unapplied")

    def __init__(self, backend: StorageBackend, unapplied: dict[bytes, tuple[int, Any]] | None = None):
        self._backend = backend
        self._values: dict[bytes, Any] = {}
        self._dirty: set[bytes] = set()
        self._unapplied = unapplied

    def prefetch(self, keys: Iterable[bytes]) -> None:
        """Load many keys with one multi-get before the batch runs."""
        values = self._values
        missing = [k for k in dict.fromkeys(keys) if k not in values]
        unapplied = self._unapplied
        if unapplied:
            # Values are never mutated in place (RUN gets copies): sharing them is safe.
            rest = []
            for key in missing:
                written = unapplied.get(key)
                if written is None:
                    rest.append(key)
                else:
                    values[key] = written[1]
            missing = rest
        if missing:
            for key, raw in zip(missing, self._backend.get_many(missing)):
                if raw is not None:
                    values[key] = decode_value(raw)
                elif not is_range_key(key):  # a range is read live, never cached (`get`)
                    values[key] = ABSENT

    def written(self) -> Iterable[tuple[bytes, Any]]:
        """(key, value) of every key this batch wrote; ABSENT for a delete."""
        values = self._values
        return ((key, values[key]) for key in self._dirty)

    def get(self, key: bytes) -> Any:
        try:
            return self._values[key]
        except KeyError:
            self.prefetch((key,))
            try:
                return self._values[key]
            except KeyError:  # a declared range: a view for the transaction holding its lock
                return RangeView(self, key)

    def range_items(self, prefix: bytes) -> list[tuple[bytes, Any]]:
        """(key, value) of every present key starting with `prefix`, in key order, as this
        overlay sees them: the shard, then unapplied batches, then this batch."""
        found: dict[bytes, Any] = {key: raw for key, raw in self._backend.prefix_items(prefix)}
        for key in found:
            found[key] = decode_value(found[key])
        if self._unapplied:
            for key, (_, value) in self._unapplied.items():
                if key.startswith(prefix):
                    found[key] = value
        for key, value in self._values.items():
            if key.startswith(prefix):
                found[key] = value
        return [(key, found[key]) for key in sorted(found) if found[key] is not ABSENT]

    def put(self, key: bytes, value: Any) -> None:
        self._values[key] = value
        self._dirty.add(key)

    def delete(self, key: bytes) -> None:
        self.put(key, ABSENT)

    def encoded_writes(self) -> dict[bytes, bytes | None]:
        values = self._values
        return {key: None if values[key] is ABSENT else encode_value(values[key]) for key in sorted(self._dirty)}
