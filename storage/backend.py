"""The storage backend interface the engine relies on. A batch is applied with one
atomic write that also records the batch as applied, so it is applied wholly or not
at all, and never twice."""

from __future__ import annotations

from typing import Any, Iterator, Protocol


class StorageBackend(Protocol):
    def get_many(self, keys: list[bytes]) -> list[bytes | None]: ...

    def apply_batch(self, writes: dict[bytes, bytes | None], marker: dict[str, Any], first: int | None = None) -> None:
        """Atomically apply encoded writes (None deletes) and record the applied marker:
        the state after batch marker["batch"], and after every batch from `first` on when
        they are one round's (scheduler/round.py)."""

    def applied(self) -> dict[str, Any] | None:
        """The marker of the last applied batch, or None for an empty shard."""

    def items(self, table: str | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Table records in key order (engine metadata excluded)."""

    def digest(self) -> int: ...

    def close(self) -> None: ...
