"""The procedure contract (Calvin's storage wrapper): ANALYZE declares the keys a
transaction will touch, from its arguments alone; RUN is deterministic logic over them.

Only registered procedures run; a request names one and gives arguments, never code.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NoReturn, Protocol, runtime_checkable

from ordo.procedures.args import Field, key_field_problem
from ordo.storage.keys import KeyRange

# A logical key: (table name, key). Keys are integers, strings, or tuples of them
# (composite keys, docs/keys.md).
Key = tuple[str, int | str | tuple]
KeySets = tuple[Iterable[Key], Iterable[Key]]


# A batch's ordering that the log stamps on it: Aria's deterministic reordering
# (scheduler/aria.py), under which procedures without ANALYZE find their keys in the batch.
ARIA = "aria"


class Abort(Exception):
    """Raised by `ctx.abort(reason)`: the transaction rolls back deterministically."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class UndeclaredAccess(Exception):
    """RUN touched a key that ANALYZE did not declare (Calvin's double-check)."""


@runtime_checkable
class Context(Protocol):
    """What RUN receives as `ctx`: `def run(ctx: ordo.Context, args)`. Reads and writes
    go to the transaction's declared keys; its time and randomness come from its place in
    the log, never from the machine, so every engine, scheduler and replay runs it alike.
    A procedure of a dataflow (docs/streaming.md) has streams and windows too: `emit`,
    `window_insert`, `window`; in a procedure that is no part of a dataflow they abort the
    transaction (`undeclared access: …`). Ordo makes the contexts; a procedure only uses
    the one it is given (docs/procedures.md, "RUN")."""

    @property
    def now(self) -> int:
        """The batch's time in milliseconds since the Unix epoch: the sequencer's clock when
        it cut the batch, the same for every transaction of the batch and in every replay,
        and the change data's `time`. An attribute: `ctx.now`, not `ctx.now()`."""
        ...

    @property
    def random(self) -> random.Random:
        """A `random.Random` seeded by the transaction's place in the log (its batch and
        index): the same draws on every engine and in every replay."""
        ...

    def read(self, table: str, key: int | str | tuple) -> Any:
        """`table[key]` as this transaction sees it: its own latest write of the key, else
        the value before the transaction, else the table's default. A composite key is a
        tuple (a list is taken as one). The value is a copy: changing it changes nothing
        until it is written. A key outside the declared read set aborts the transaction."""
        ...

    def write(self, table: str, key: int | str | tuple, value: Any) -> None:
        """Set `table[key]` to `value`, kept only if RUN returns (the transaction commits).
        The key must be in the declared write set, the value one that storage holds
        (docs/procedures.md, "Tables and keys"); otherwise the transaction aborts."""
        ...

    def delete(self, table: str, key: int | str | tuple) -> None:
        """Make `table[key]` absent (it then reads as the table's default), kept only if RUN
        returns; the key must be in the declared write set."""
        ...

    def scan(self, table: str, prefix: tuple) -> list[tuple[Any, Any]]:
        """`[(key, value)]` of every present key of `table` whose leading components are
        `prefix`, in key order, this transaction's own writes included. The range must be
        declared in the read set (`Prefix(table, prefix)`, docs/keys.md)."""
        ...

    def abort(self, reason: str) -> NoReturn:
        """Stop RUN: nothing it wrote is kept, and the outcome is `aborted` with `reason` as
        its error. In a procedure triggered by a stream, only that procedure's writes and
        emits (and its nested transaction's) are rolled back; the dataflow goes on."""
        ...

    def emit(self, stream: str, item: Any) -> None:
        """Dataflows: append the tuple `item` (a list; a tuple is taken as one) to
        `stream`, which must name this procedure as a producer. The stream's consumers fire
        after this procedure with the tuples of this slot, its `on_insert` runs now, and an
        output stream's tuples are published on `<ns>.stream.<name>` (docs/streaming.md)."""
        ...

    def window_insert(self, name: str, item: Any) -> bool:
        """Dataflows: stage `item` in window `name`, which this procedure must own; True when
        the window slid (its `on_slide` has then run), False while the tuple waits staged."""
        ...

    def window(self, name: str) -> list:
        """Dataflows: the rows of window `name` of this dataflow, oldest first, without the
        tuples staged until its next slide."""
        ...


TxnContext = Context  # the name this protocol had before it was public


@dataclass(frozen=True, slots=True)
class Table:
    """A table: the value a never-written key reads as, and how keys map to partitions.

    `partitioner` is "hash" (a stable hash of the encoded key) or "modulo" (integer
    key modulo the partition count, so a generator can aim at a partition).
    `partition_by=i` places a composite (tuple) key by its i-th component alone (an
    integer modulo the partition count, a string by its hash), so related rows stay
    together: TPC-C's tables by warehouse id (docs/keys.md). It sets `partitioner` to
    "component:i".
    `range_by=k` lets transactions declare ranges of this table: `Prefix(table, first k
    components)`, which must include the partition component. Every access to a key of
    such a table also locks the range it lies in (docs/keys.md).
    """

    name: str
    default: Any = 0
    partitioner: str = "hash"
    partition_by: int | None = None
    range_by: int | None = None

    def __post_init__(self) -> None:
        if self.range_by is not None and (
            self.partition_by is None or type(self.range_by) is not int or not self.partition_by < self.range_by
        ):
            raise ValueError(f"table '{self.name}': range_by needs partition_by, and must exceed it")
        if self.partition_by is not None:
            if type(self.partition_by) is not int or self.partition_by < 0:
                raise ValueError(f"table '{self.name}': partition_by must be a component index >= 0")
            object.__setattr__(self, "partitioner", f"component:{self.partition_by}")
        elif self.partitioner not in ("hash", "modulo"):
            raise ValueError(f"table '{self.name}': partitioner must be 'hash' or 'modulo'")


def Prefix(table: str, prefix) -> Key:  # noqa: N802  (reads as a declaration in ANALYZE)
    """A declared range for a read or write set: every key of `table` whose leading
    components are `prefix` (a table with `range_by=len(prefix)`). In the read set, RUN may
    read any key in it (`ctx.read`) or all of them (`ctx.scan`); in the write set, write
    any key in it."""
    return (table, KeyRange(prefix))


@dataclass(frozen=True, slots=True)
class Procedure:
    """A registered stored procedure.

    analyze(args) -> (read set, write set) of logical keys; or None, with `home` given: a
        procedure whose keys are found by running RUN: in log order by a turn of its own
        in the log (procedures/ollp.py), in a batch ordered by aria within the batch
        (scheduler/aria.py).
    run(ctx, args) -> result (any msgpack/JSON-serialisable value).
    operations: the optional per-key operation form used by the operation-chain scheduler.
    reconnoiter: for sets that depend on stored values (Calvin's OLLP, procedures/ollp.py):
        reconnoiter(args) -> the keys to read first; analyze is then analyze(args, assumed).
    dataflow: the streams, windows and nested transactions composed into a procedure that
        starts a dataflow (procedures/streams.py), described by value for the procedure-set
        fingerprint (procedures/fingerprint.py).
    home: without analyze, where a request is routed: the partition owning this key, a
        (table, argument name) pair (the key is that argument's value) or a function
        args -> (table, key). That partition runs its RUN and reports its outcome.
    """

    name: str
    args: dict[str, Field]
    analyze: Callable[[dict], KeySets] | None
    run: Callable[[Context, dict], Any]
    operations: Callable[[dict], Any] | None = field(default=None)
    reconnoiter: Callable[[dict], Iterable[Key]] | None = field(default=None)
    dataflow: str | None = field(default=None)
    home: tuple[str, str] | Callable[[dict], Key] | None = field(default=None)

    def __post_init__(self) -> None:
        if self.analyze is not None:
            return
        if self.home is None:
            raise TypeError(
                f"procedure '{self.name}': without analyze it needs home= (the key that routes "
                "it, e.g. home=('account', 'src')); its keys are then found by running it"
            )
        if self.operations is not None or self.reconnoiter is not None:
            raise TypeError(f"procedure '{self.name}': operations and reconnoiter need analyze")
        if not callable(self.home) and not (
            type(self.home) is tuple and len(self.home) == 2 and all(type(part) is str for part in self.home)
        ):
            raise TypeError(
                f"procedure '{self.name}': home must be a (table, argument name) pair or a "
                f"function of the arguments returning (table, key), got {self.home!r}"
            )
        if type(self.home) is tuple:
            argument = self.home[1]
            if argument not in self.args:
                raise TypeError(f"procedure '{self.name}': home names argument '{argument}', which is not in args")
            problem = key_field_problem(self.args[argument])
            if problem is not None:
                raise TypeError(f"procedure '{self.name}': home names argument '{argument}': {problem}")


def home_key(procedure: Procedure, args: dict) -> Key:
    """The key a procedure without analyze is routed by, for these arguments."""
    home = procedure.home
    if callable(home):
        return home(args)
    table, argument = home
    return table, args[argument]
