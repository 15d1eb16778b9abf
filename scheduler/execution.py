"""Running one transaction: the context RUN sees, and the pure function that turns
(procedure, arguments, read values) into an outcome and a set of writes.

Every scheduler and every partition layout funnels through `execute`, so they all decide
commit/abort, results and writes identically.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

from procedures.contract import Abort, Procedure, UndeclaredAccess
from storage.keys import encode_key
from storage.overlay import ABSENT
from storage.values import encode_value

COMMITTED = "committed"
ABORTED = "aborted"
REJECTED = "rejected"

_SCALARS = (int, str, float, bool, type(None), bytes)
# A result travels in one outcome message; larger ones abort the transaction instead.
MAX_RESULT_BYTES = 64 * 1024
MAX_ERROR_CHARS = 1000


def _short(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"


class TxnContext:
    """What RUN sees. Reads come from a snapshot taken at the transaction's turn; writes
    are buffered and reach storage only if the transaction commits."""

    __slots__ = ("_snapshot", "_write_set", "_defaults", "writes", "now", "_seed", "_random")

    def __init__(self, snapshot: dict[bytes, Any], write_set: frozenset[bytes] | dict,
                 defaults: dict[str, Any], now: int, seed: int):
        self._snapshot = snapshot
        self._write_set = write_set
        self._defaults = defaults
        self.writes: dict[bytes, list] = {}
        self.now = now
        self._seed = seed
        self._random: random.Random | None = None

    @property
    def random(self) -> random.Random:
        if self._random is None:
            self._random = random.Random(self._seed)
        return self._random

    def read(self, table: str, key: int | str) -> Any:
        encoded = encode_key(table, key)
        written = self.writes.get(encoded)
        if written is not None:
            value = written[2]
        else:
            try:
                value = self._snapshot[encoded]
            except KeyError:
                raise UndeclaredAccess(f"read of {table}[{key!r}] is not in the read set declared by ANALYZE") from None
        if value is ABSENT:
            value = self._defaults.get(table, 0)
        if type(value) in _SCALARS:
            return value
        return copy.deepcopy(value)  # stored values stay immutable whatever RUN does

    def write(self, table: str, key: int | str, value: Any) -> None:
        encoded = encode_key(table, key)
        if encoded not in self._write_set:
            raise UndeclaredAccess(f"write of {table}[{key!r}] is not in the write set declared by ANALYZE")
        if type(value) not in _SCALARS:
            encode_value(value)  # a value storage cannot hold fails this txn, not the batch
            value = copy.deepcopy(value)
        self.writes[encoded] = [table, key, value]

    def delete(self, table: str, key: int | str) -> None:
        encoded = encode_key(table, key)
        if encoded not in self._write_set:
            raise UndeclaredAccess(f"delete of {table}[{key!r}] is not in the write set declared by ANALYZE")
        self.writes[encoded] = [table, key, ABSENT]

    def abort(self, reason: str) -> None:
        raise Abort(str(reason))


def txn_seed(batch_id: int, index: int) -> int:
    return (batch_id << 32) | index


def execute(procedure: Procedure, args: dict, snapshot: dict[bytes, Any], write_set,
            defaults: dict[str, Any], now: int, seed: int) -> tuple[str, Any, str | None, dict[bytes, list]]:
    """Run RUN once: (status, result, error, writes). Never raises for a procedure's fault."""
    ctx = TxnContext(snapshot, write_set, defaults, now, seed)
    try:
        result = procedure.run(ctx, args)
        kind = type(result)
        if kind is not int and kind is not bool and result is not None:
            size = len(json.dumps(result, allow_nan=False))
            if size > MAX_RESULT_BYTES:
                return ABORTED, None, f"result too large: {size} bytes > limit {MAX_RESULT_BYTES}", {}
    except Abort as exc:
        return ABORTED, None, _short(exc.reason), {}
    except UndeclaredAccess as exc:
        return ABORTED, None, f"undeclared access: {exc}", {}
    except Exception as exc:  # RUN is user code: its failure aborts this txn only
        return ABORTED, None, _short(f"{procedure.name} raised {type(exc).__name__}: {exc}"), {}
    return COMMITTED, result, None, ctx.writes
