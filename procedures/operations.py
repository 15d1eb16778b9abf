"""The operation form of a procedure (TStream): its state access written as per-key
operations, so the operation-chain scheduler can split one transaction across per-key
chains instead of running it whole.

A procedure declares it with `Procedure(..., operations=f)`, where `f(args)` returns an
`Operations` (or a plain list of operations, whose result is then None):

    READ(table, key)                          the key's value; feeds the result
    WRITE(table, key, value, condition)       the key becomes `value`
    READ_MODIFY(table, key, fn, deps, cond)   the key becomes fn(own value, *dep values)

Meaning, which is what makes the form equivalent to RUN:

- Every read of another key — a READ_MODIFY's `deps`, a condition's keys — sees that key
  as it stands just before this transaction in log order (after every earlier
  transaction, before any of this one's writes). Write the form so that RUN reads those
  keys before it writes them, as sl_transfer checks its funds before moving them.
- Operations of one transaction on the same key apply in declaration order, each seeing
  the previous one's effect: RUN's own-writes-then-read behaviour, needed for repeated
  keys such as micro_rmw {keys: [3, 3]} or a transfer whose source is its destination.
- A condition guards the whole transaction, not only the operation that names it: if any
  condition is false, no operation takes effect on any key and the transaction aborts
  with the condition's reason. Conditions are tested in first-seen order, so give them the
  order in which RUN tests them, and RUN's abort reason, to get RUN's error text.
- The result is `result(outputs)`, outputs in declaration order: a READ gives the value it
  read, a WRITE the value written, a READ_MODIFY its new value.
- Keys absent from storage read as their table's default. Functions get private copies
  of structured values and must return new values; they must be pure, deterministic and
  must not raise for values their tables can hold (the scheduler otherwise falls back to
  running RUN for the affected transactions, which is correct but slow).

The form must write exactly the keys RUN writes when RUN commits (a READ_MODIFY that
changes nothing still counts as a write: make RUN write that key too), or the change data
would differ between schedulers.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ordo.procedures.contract import Key

# An operation is a plain tuple, cheap to build by the thousands per batch:
#   (kind, table, key, value for WRITE or fn for READ_MODIFY, deps, condition)
Operation = tuple

OP_READ = 0
OP_WRITE = 1
OP_MODIFY = 2


class Condition:
    """A guard of the whole transaction: `test(*values of keys)` must be true."""

    __slots__ = ("keys", "test", "reason")

    def __init__(self, keys: Iterable[Key], test: Callable[..., bool], reason: str):
        self.keys = tuple(keys)
        self.test = test
        self.reason = reason

    def __repr__(self) -> str:
        return f"Condition({self.keys!r}, reason={self.reason!r})"


class Operations:
    """A transaction in operation form: its operations and how outputs become the result."""

    __slots__ = ("ops", "result")

    def __init__(self, ops: Iterable[Operation], result: Callable[[list], Any] | None = None):
        self.ops = ops if type(ops) is list else list(ops)
        self.result = result


def READ(table: str, key: int | str) -> Operation:  # noqa: N802  (TStream's API names)
    return (OP_READ, table, key, None, (), None)


def WRITE(  # noqa: N802
    table: str,
    key: int | str,
    value: Any,
    condition: Condition | None = None,
) -> Operation:
    return (OP_WRITE, table, key, value, (), condition)


def READ_MODIFY(  # noqa: N802
    table: str,
    key: int | str,
    fn: Callable[..., Any],
    deps: Iterable[Key] = (),
    condition: Condition | None = None,
) -> Operation:
    return (OP_MODIFY, table, key, fn, deps if type(deps) is tuple else tuple(deps), condition)


def as_operations(form: Any) -> Operations:
    """What `Procedure.operations(args)` returned, as an `Operations`."""
    if type(form) is Operations:
        return form
    if type(form) in (list, tuple):
        return Operations(form)
    raise TypeError(f"an operation form is Operations or a list of operations, not {type(form).__name__}")


def _increment(value: int) -> int:
    return value + 1


def adder(amount: int) -> Callable[[int], int]:
    """fn(v) = v + amount, for READ_MODIFY."""
    if amount == 1:
        return _increment

    def add(value: int) -> int:
        return value + amount

    return add


def increment_ops(table: str, keys: Iterable[int | str], amount: int = 1) -> Operations:
    """Each key += amount (a repeated key twice), no condition, no result."""
    fn = adder(amount)
    return Operations([(OP_MODIFY, table, key, fn, (), None) for key in keys])
