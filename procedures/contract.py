"""The procedure contract (Calvin's storage wrapper): ANALYZE declares the keys a
transaction will touch, from its arguments alone; RUN is deterministic logic over them.

Only registered procedures run; a request names one and gives arguments, never code.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Protocol

from procedures.args import Field

# A logical key: (table name, key). Keys are integers or strings.
Key = tuple[str, int | str]
KeySets = tuple[Iterable[Key], Iterable[Key]]


class Abort(Exception):
    """Raised by `ctx.abort(reason)`: the transaction rolls back deterministically."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class UndeclaredAccess(Exception):
    """RUN touched a key that ANALYZE did not declare (Calvin's double-check)."""


class TxnContext(Protocol):
    """What RUN sees. `now` and `random` come from the batch, never from the machine."""

    now: int  # sequencer time of the batch, milliseconds since the epoch
    random: random.Random  # seeded by (batch id, txn index)

    def read(self, table: str, key: int | str) -> Any: ...

    def write(self, table: str, key: int | str, value: Any) -> None: ...

    def delete(self, table: str, key: int | str) -> None: ...

    def abort(self, reason: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Table:
    """A table: the value a never-written key reads as, and how keys map to partitions.

    `partitioner` is "hash" (a stable hash of the encoded key) or "modulo" (integer
    key modulo the partition count, so a generator can aim at a partition).
    """

    name: str
    default: Any = 0
    partitioner: Literal["hash", "modulo"] = "hash"


@dataclass(frozen=True, slots=True)
class Procedure:
    """A registered stored procedure.

    analyze(args) -> (read set, write set) of logical keys.
    run(ctx, args) -> result (any msgpack/JSON-serialisable value).
    operations: the optional per-key operation form used by the operation-chain scheduler.
    """

    name: str
    args: dict[str, Field]
    analyze: Callable[[dict], KeySets]
    run: Callable[[TxnContext, dict], Any]
    operations: Callable[[dict], Any] | None = field(default=None)
