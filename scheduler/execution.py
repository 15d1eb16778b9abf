"""Running one transaction: the context RUN sees, and the pure function that turns
(procedure, arguments, read values) into an outcome and a set of writes.

Every scheduler and every partition layout funnels through `execute`, so they all decide
commit/abort, results and writes identically.
"""

from __future__ import annotations

import json
import random
from typing import Any, NoReturn

import msgpack

from ordo.procedures.args import WIRE_INT_MAX, WIRE_INT_MIN, list_fields, text_problem, value_problem
from ordo.procedures.contract import Abort, Procedure, UndeclaredAccess
from ordo.procedures.ollp import check_turn, found_step, split_args
from ordo.procedures.streams import DataflowResult
from ordo.storage.keys import KeyRange, decode_key, encode_key, is_range_key, range_scan_prefix
from ordo.storage.overlay import ABSENT, RangeView
from ordo.storage.values import decode_value, encode_value

COMMITTED = "committed"
ABORTED = "aborted"
REJECTED = "rejected"

_SCALARS = (int, str, float, bool, type(None), bytes)
# A result travels in one outcome message; larger ones abort the transaction instead.
MAX_RESULT_BYTES = 64 * 1024
# A written value travels in one change-data message, with its key (at most a request's
# 64 KiB, 384 KiB as escaped JSON) under the broker's 1 MiB limit; a larger value aborts
# the transaction that writes it, as a result over MAX_RESULT_BYTES does. The change data
# is never split inside a value, so a consumer always gets whole values.
MAX_VALUE_BYTES = 480 * 1024
_SHORT_TEXT = MAX_VALUE_BYTES // 6 - 1  # text this long fits whatever it escapes to
MAX_ERROR_CHARS = 1000

_packb, _unpackb = msgpack.packb, msgpack.unpackb
# As the outcome record encodes a result (scheduler/outputs.py), but strict about NaN.
_result_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
# As a change record encodes a value (scheduler/outputs.py).
_value_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class _AnyKey:
    """The write set of a procedure without ANALYZE in an aria pass: every key."""

    __slots__ = ()

    def __contains__(self, key: bytes) -> bool:
        return True

    def __iter__(self):
        return iter(())


ANY_KEY = _AnyKey()


class BadValue(Exception):
    """RUN wrote a value that a shard or the change data cannot hold."""


def _short(text: str) -> str:
    if text_problem(text) is not None:  # an error is published as UTF-8 like any output
        text = text.encode("utf-8", "backslashreplace").decode()
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"


# The two checks below are the only ones every scheduler applies to what RUN (or an
# operation form standing in for it) hands back, so no scheduler can commit what
# another aborts. Both rest on `value_problem`, the rule the request wire uses too.


def stored_value(value: Any) -> Any:
    """`value` as a shard will hold it, or BadValue. A container comes back as a private
    copy, normalized as reading it back from the shard gives it (tuples as lists, maps in
    key order), so a later transaction sees the same value whether it reads it from this
    batch, an earlier unapplied one or the shard."""
    kind = type(value)
    if kind is int:
        if WIRE_INT_MIN <= value <= WIRE_INT_MAX:
            return value
    elif kind is str:
        if value.isascii() and len(value) <= _SHORT_TEXT:
            return value
    elif kind is bool or value is None:
        return value
    elif kind is dict:
        row = _flat_row(value)
        if row is not None:
            return row
    problem = value_problem(value)
    if problem is not None:
        raise BadValue(problem)
    if kind is list or kind is tuple or kind is dict:
        try:
            packed = encode_value(value)
        except TypeError:  # canonical order needs comparable map keys
            raise BadValue("map keys mix text and integers") from None
        if len(packed) * 8 > MAX_VALUE_BYTES:  # JSON takes at most 8 bytes per msgpack byte
            _check_size(value)
        return decode_value(packed)
    if kind is str and len(value) > _SHORT_TEXT:
        _check_size(value)
    return value


def _check_size(value: Any) -> None:
    text = _value_json(value)
    size = len(text) if text.isascii() else len(text.encode())
    if size > MAX_VALUE_BYTES:
        raise BadValue(f"value too large: {size} bytes as change data > limit {MAX_VALUE_BYTES}")


def _flat_row(row: dict) -> dict | None:
    """What the msgpack round trip gives a map of text keys to scalars (a table row, the
    common case): a private copy in key order, without walking it twice. None for any
    other map, which takes the general path."""
    text = 0
    for key, member in row.items():
        if type(key) is not str or not key.isascii():
            return None
        text += len(key)
        kind = type(member)
        if kind is int:
            if not WIRE_INT_MIN <= member <= WIRE_INT_MAX:
                return None
        elif kind is str:
            if not member.isascii():
                return None
            text += len(member)
        elif member is not None and kind is not bool:
            return None
    if text + len(row) * 32 > _SHORT_TEXT:  # maybe too large: measured on the general path
        return None
    return {key: row[key] for key in sorted(row)}


def result_problem(result: Any) -> str | None:
    """Why `result` cannot be published in an outcome record, or None."""
    kind = type(result)
    if result is None or kind is bool or (kind is int and WIRE_INT_MIN <= result <= WIRE_INT_MAX):
        return None
    problem = value_problem(result)
    if problem is not None:
        return f"result cannot be published: {problem}"
    if kind is str and len(result) * 6 + 2 <= MAX_RESULT_BYTES:
        return None  # escaped, each character takes at most 6 bytes
    text = _result_json(result)
    size = len(text) if text.isascii() else len(text.encode())
    if size > MAX_RESULT_BYTES:
        return f"result too large: {size} bytes > limit {MAX_RESULT_BYTES}"
    return None


def private_args(args: dict, schema: dict) -> dict:
    """A copy of `args` for RUN to change as it likes. RUN may run again on the same
    arguments (an operation-chain stretch that falls back to RUN), and partitions in one
    process share the decoded log entry; a RUN that changed them in place would make
    those runs see another transaction than the log holds.

    Arguments passed their schema. Under Int, Str and List fields they are flat, so a
    dict copy and a copy of each list is a private copy: measured 0.2 us for sl's
    arguments and 0.4 us for micro's, where copy.deepcopy takes 3 us and executing the
    transaction 2 us (sl) to 5 us (micro). Other schemas take a msgpack round trip, which
    gives exactly what decoding the entry from the log gives."""
    lists = list_fields(schema)
    if lists is None:
        return _unpackb(_packb(args), strict_map_key=False)
    own = args.copy()
    for name in lists:
        own[name] = own[name].copy()
    return own


class TxnContext:
    """What RUN sees. Reads come from a snapshot taken at the transaction's turn; writes
    are buffered and reach storage only if the transaction commits."""

    __slots__ = ("_snapshot", "_write_set", "_defaults", "writes", "now", "_seed", "_random", "_write_ranges")

    def __init__(
        self,
        snapshot: dict[bytes, Any],
        write_set: frozenset[bytes] | dict,
        defaults: dict[str, Any],
        now: int,
        seed: int,
    ):
        self._snapshot = snapshot
        self._write_set = write_set
        self._defaults = defaults
        self.writes: dict[bytes, list] = {}
        self.now = now
        self._seed = seed
        self._random: random.Random | None = None
        self._write_ranges: tuple[bytes, ...] | None = None

    @property
    def random(self) -> random.Random:
        if self._random is None:
            self._random = random.Random(self._seed)
        return self._random

    def read(self, table: str, key: int | str | tuple) -> Any:
        if type(key) is list:
            key = tuple(key)  # a composite key as msgpack or JSON gave it
        encoded = encode_key(table, key)
        written = self.writes.get(encoded)
        if written is not None:
            value = written[2]
        else:
            try:
                value = self._snapshot[encoded]
            except KeyError:
                value = self._in_range(table, key, encoded)
        if value is ABSENT:
            value = self._defaults.get(table, 0)
        if type(value) in _SCALARS:
            return value
        # Stored values stay immutable whatever RUN does. They are msgpack-normal (see
        # stored_value), so a msgpack round trip is an exact copy, several times faster
        # than copy.deepcopy for a row of a dozen fields.
        return _unpackb(_packb(value), strict_map_key=False)

    def write(self, table: str, key: int | str | tuple, value: Any) -> None:
        if type(key) is list:
            key = tuple(key)
        encoded = encode_key(table, key)
        if encoded not in self._write_set and not self._in_write_range(encoded):
            raise UndeclaredAccess(f"write of {table}[{key!r}] is not in the write set declared by ANALYZE")
        if type(value) is not int or not WIRE_INT_MIN <= value <= WIRE_INT_MAX:  # inline: the common case
            try:
                value = stored_value(value)  # a value storage cannot hold fails this txn, not the batch
            except BadValue as exc:
                raise BadValue(f"{table}[{key!r}]: {exc}") from None
        self.writes[encoded] = [table, key, value]

    def delete(self, table: str, key: int | str | tuple) -> None:
        if type(key) is list:
            key = tuple(key)
        encoded = encode_key(table, key)
        if encoded not in self._write_set and not self._in_write_range(encoded):
            raise UndeclaredAccess(f"delete of {table}[{key!r}] is not in the write set declared by ANALYZE")
        self.writes[encoded] = [table, key, ABSENT]

    def abort(self, reason: str) -> NoReturn:
        raise Abort(str(reason))

    # Streams and windows belong to dataflows (procedures/streams.py's StreamContext): a
    # procedure that is no part of one has none, and says so rather than AttributeError.

    def emit(self, stream: str, item: Any) -> None:
        raise UndeclaredAccess(
            f"emit to stream '{stream}': this procedure is no part of a dataflow (docs/streaming.md)"
        )

    def window_insert(self, name: str, item: Any) -> bool:
        raise UndeclaredAccess(
            f"insert into window '{name}': this procedure is no part of a dataflow (docs/streaming.md)"
        )

    def window(self, name: str) -> list:
        raise UndeclaredAccess(f"read of window '{name}': this procedure is no part of a dataflow (docs/streaming.md)")

    # Declared ranges (docs/keys.md): looked for only when a key is not declared itself.

    def _in_range(self, table: str, key: Any, encoded: bytes) -> Any:
        for view in self._snapshot.values():
            if type(view) is RangeView and encoded.startswith(view.prefix):
                return view.get(encoded)
        raise UndeclaredAccess(f"read of {table}[{key!r}] is not in the read set declared by ANALYZE")

    def _in_write_range(self, encoded: bytes) -> bool:
        ranges = self._write_ranges
        if ranges is None:
            ranges = self._write_ranges = tuple(range_scan_prefix(k) for k in self._write_set if is_range_key(k))
        return bool(ranges) and encoded.startswith(ranges)

    def scan(self, table: str, prefix) -> list[tuple[Any, Any]]:
        """[(key, value)] of every present key in a declared read range, in key order,
        this transaction's own writes included."""
        encoded = encode_key(table, KeyRange(prefix))
        view = self._snapshot.get(encoded)
        if type(view) is not RangeView:
            raise UndeclaredAccess(f"scan of {table}{list(prefix)} is not a range declared in the read set")
        found = dict(view.items())
        for written, (_, _, value) in self.writes.items():
            if written.startswith(view.prefix):
                found[written] = value
        return [
            (decode_key(k)[1], v if type(v) in _SCALARS else _unpackb(_packb(v), strict_map_key=False))
            for k, v in sorted(found.items())
            if v is not ABSENT
        ]


def txn_seed(batch_id: int, index: int) -> int:
    return (batch_id << 32) | index


def execute(
    procedure: Procedure,
    args: dict,
    snapshot: dict[bytes, Any],
    write_set,
    defaults: dict[str, Any],
    now: int,
    seed: int,
    in_log_order: bool = True,
) -> tuple[str, Any, str | None, dict[bytes, list]]:
    """Run RUN once: (status, result, error, writes). Never raises for a procedure's fault.

    A procedure without ANALYZE runs in log order on the sets found for it so far (see
    `_found`); `in_log_order=False` (aria's passes) lets it reach whatever `snapshot` and
    `write_set` let it, the caller fencing it."""
    if procedure.reconnoiter is not None:  # its assumptions are checked first (procedures/ollp.py)
        try:
            decided = check_turn(procedure, args, snapshot, defaults, now)
        except Exception as exc:
            return ABORTED, None, _short(f"{procedure.name}: reconnaissance failed: {type(exc).__name__}: {exc}"), {}
        if decided is not None:
            return (*decided, {})
    elif procedure.analyze is None:
        args, record = split_args(args)
        if in_log_order:
            return _found(procedure, args, record, snapshot, write_set, defaults, now, seed)
    ctx = TxnContext(snapshot, write_set, defaults, now, seed)
    try:
        result = procedure.run(ctx, private_args(args, procedure.args))
    except Abort as exc:
        return ABORTED, None, _short(exc.reason), {}
    except UndeclaredAccess as exc:
        return ABORTED, None, _short(f"undeclared access: {exc}"), {}
    except BadValue as exc:
        return ABORTED, None, _short(f"{procedure.name}: cannot store {exc}"), {}
    except Exception as exc:  # RUN is user code: its failure aborts this txn only
        return ABORTED, None, _short(f"{procedure.name} raised {type(exc).__name__}: {exc}"), {}
    value = result.value if type(result) is DataflowResult else result  # procedures/streams.py
    if value is not None and (type(value) is not int or not WIRE_INT_MIN <= value <= WIRE_INT_MAX):
        problem = result_problem(value)
        if problem is not None:
            return ABORTED, None, problem, {}
    return COMMITTED, result, None, ctx.writes


def _found(
    procedure: Procedure,
    args: dict,
    record: dict | None,
    snapshot: dict[bytes, Any],
    write_set,
    defaults: dict[str, Any],
    now: int,
    seed: int,
) -> tuple[str, Any, str | None, dict[bytes, list]]:
    """A procedure without ANALYZE at its turn in log order: RUN on the sets found for it
    (procedures/ollp.py). If it stays within them, its outcome is RUN's. If it reaches a
    key outside them, nothing is kept and it is re-sequenced with every key it touched:
    the keys outside read as absent (their table's default), so one run finds as many as
    it can, and which keys it touches is a function of the log alone."""
    read, written = _NotedReads(snapshot), _NotedWrites(write_set)
    decided = execute(procedure, args, read, written, defaults, now, seed, in_log_order=False)
    if not (read.outside or written.outside):
        return decided
    return (*found_step(procedure, args, record, read.keys, written.keys, now), {})


class _NotedReads(dict):
    """A snapshot that notes every key RUN reads from it; a key it lacks reads as absent."""

    __slots__ = ("keys", "outside")

    def __init__(self, snapshot: dict[bytes, Any]):
        super().__init__(snapshot)
        self.keys: dict[bytes, None] = {}
        self.outside = False

    def __getitem__(self, key: bytes) -> Any:
        self.keys[key] = None
        try:
            return dict.__getitem__(self, key)
        except KeyError:
            self.outside = True
            return ABSENT


class _NotedWrites:
    """A write set that notes every key RUN writes, and lets it write any other."""

    __slots__ = ("_declared", "keys", "outside")

    def __init__(self, declared):
        self._declared = declared
        self.keys: dict[bytes, None] = {}
        self.outside = False

    def __contains__(self, key: bytes) -> bool:
        self.keys[key] = None
        if key not in self._declared:
            self.outside = True
        return True
