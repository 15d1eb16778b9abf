"""The plain serial interpretation of a log: every request, one at a time, in log order,
over a dictionary. No overlay, no scheduler, no partitions: the yardstick every engine
configuration is checked against.

A batch stamped with the aria ordering is read in its own documented serial order
(scheduler/aria.py): its first-pass commits, chosen here from what every earlier position
read and wrote, in the order read-before-write, smallest position first; then the rest in
fallback rounds, each in log order. Each request runs one at a time against the
dictionary (the first-pass commits again, not their first passes' writes)."""

from __future__ import annotations

from typing import Any, Iterable

from ordo.procedures.ollp import restarts_of
from ordo.procedures.registry import Registry, RequestError
from ordo.procedures.streams import split_result
from ordo.scheduler.execution import ABORTED, ANY_KEY, COMMITTED, REJECTED, execute, txn_seed
from ordo.log.records import ARIA, Batch
from ordo.storage.digest import digest_pairs
from ordo.storage.keys import KeyRange, decode_key, encode_key, is_range_key
from ordo.storage.overlay import ABSENT, RangeView
from ordo.storage.values import encode_value


class SerialInterpreter:
    def __init__(self, registry: Registry):
        self.registry = registry
        self.defaults = {t.name: t.default for t in registry.tables.values()}
        self.state: dict[bytes, Any] = {}
        self.outcomes: list[dict[str, Any]] = []
        self.changes: list[tuple] = []  # (batch, txn index, table, key, value or None)
        self._ranges = _StateRanges(self.state)
        self.aria_orders: dict[int, list[int]] = {}  # batch -> its positions in the order they ran
        self.aria_commits: dict[int, list[int]] = {}  # batch -> its first-pass commits

    def apply(self, batches: Iterable[Batch]) -> "SerialInterpreter":
        for batch in batches:
            if batch.ordering == ARIA:
                self._aria(batch)
                continue
            for index, (request_id, proc, args) in enumerate(batch.entries):
                self._one(batch, index, request_id, proc, args)
        return self

    def _aria(self, batch: Batch) -> None:
        from ordo.scheduler.aria import FALLBACK_ROUNDS, kept_changing

        entries = batch.entries
        touched = {}  # position -> (keys read, keys written, declared?) running at the batch's start
        for index, (_, proc, args) in enumerate(entries):
            if proc is not None:
                try:
                    touched[index] = self._touched(batch, index, proc, args)
                except RequestError:
                    pass
        first = []
        read_before: set[bytes] = set()  # every key an earlier position read, and wrote
        written_before: set[bytes] = set()
        for t, (read, written, _) in touched.items():  # in log order
            waw = bool(written & written_before)
            raw = bool(read & written_before)
            war = bool(written & read_before)
            if not waw and not (raw and war):
                first.append(t)
            read_before |= read
            written_before |= written
        readers: dict[bytes, set[int]] = {}
        for t in first:
            for key in touched[t][0]:
                readers.setdefault(key, set()).add(t)
        # t may run once every commit that reads a key t writes has run
        after = {t: {u for key in touched[t][1] for u in readers.get(key, ()) if u != t} for t in first}
        order, placed = [], set()
        while len(order) < len(first):  # the smallest ready one
            t = min(t for t in first if t not in placed and after[t] <= placed)
            order.append(t)
            placed.add(t)
        start = len(self.outcomes), len(self.changes)
        for index in order:
            self._one(batch, index, *entries[index])
        for index in range(len(entries)):
            if index not in touched:  # rejected
                self._one(batch, index, *entries[index])
        fallback = [
            (t, None if declared else read | written)
            for t, (read, written, declared) in touched.items()
            if t not in placed
        ]
        for _ in range(FALLBACK_ROUNDS):
            going_on = []
            for index, keys in fallback:
                outside = self._one(batch, index, *entries[index], locked=keys)
                order.append(index)
                if outside is not None:
                    going_on.append((index, keys | {outside}))
            fallback = going_on
        for index, _ in fallback:
            request_id, proc, args = entries[index]
            self.outcomes.append(
                self._outcome(batch, index, request_id, proc, args, ABORTED, None, kept_changing(proc))
            )
        self.aria_orders[batch.batch_id] = order
        self.aria_commits[batch.batch_id] = sorted(first)
        # Published as every engine publishes them: outcomes by position; change data as
        # CollectedOutputs lists it, by position then key (its serial order is `aria_orders`).
        self.outcomes[start[0] :] = sorted(self.outcomes[start[0] :], key=lambda o: o["txn"])
        self.changes[start[1] :] = sorted(self.changes[start[1] :], key=lambda c: (c[1], encode_key(c[2], c[3])))

    def _touched(self, batch: Batch, index: int, proc, args) -> tuple[set, set, bool]:
        """The keys a request reads and writes running at the batch's start (nothing
        applied), and whether it has ANALYZE."""
        procedure, reads, writes = self.registry.analyze(proc, args, batch.ordering)
        read: set[bytes] = set()
        snapshot = _Watched(read, None if procedure.analyze is not None else self._value)
        for table, key in reads if procedure.analyze is not None else ():
            encoded = encode_key(table, key)
            dict.__setitem__(
                snapshot,
                encoded,
                RangeView(_WatchedRange(self._ranges, encoded, read), encoded)
                if type(key) is KeyRange
                else self._value(encoded),
            )
        write_set = {encode_key(table, key) for table, key in writes} if procedure.analyze is not None else ANY_KEY
        _, _, _, written = execute(
            procedure,
            args,
            snapshot,
            write_set,
            self.defaults,
            batch.time_ms,
            txn_seed(batch.batch_id, index),
            in_log_order=False,
        )
        keys = set(written)
        for table, key, _ in written.values():
            shape = self.registry.range_tables.get(table)
            if shape is not None and type(key) is tuple and len(key) >= shape[0]:
                keys.add(encode_key(table, KeyRange(key[: shape[0]])))
        return read, keys, procedure.analyze is not None

    def _value(self, encoded: bytes):
        """Any key, for a procedure without ANALYZE; no range (a scan needs one declared)."""
        return ABSENT if is_range_key(encoded) else self.state.get(encoded, ABSENT)

    def _one(self, batch: Batch, index: int, request_id: str, proc, args, locked: set | None = None) -> bytes | None:
        """Run one request at its turn. `locked`: the only keys a procedure without ANALYZE
        may touch (an aria fallback round); the first other key it reaches is returned, and
        the request is left undecided."""
        if proc is None:
            self.outcomes.append(self._outcome(batch, index, request_id, proc, args, REJECTED, None, args))
            return None
        try:
            procedure, reads, writes = self.registry.analyze(proc, args, batch.ordering)
        except RequestError as exc:
            self.outcomes.append(self._outcome(batch, index, request_id, proc, args, REJECTED, None, str(exc)))
            return None
        snapshot, write_set = {}, set()
        aria = batch.ordering == ARIA
        if procedure.analyze is None and aria:  # any key, or in a fallback round its locked keys
            if locked is None:
                snapshot, write_set, reads = _Watched(set(), self._value), ANY_KEY, ()
            else:
                reads = writes = [decode_key(key) for key in sorted(locked)]
                snapshot, write_set = _Fenced(), _FencedWrites()
        for table, key in reads:
            encoded = encode_key(table, key)
            snapshot[encoded] = (
                RangeView(self._ranges, encoded) if type(key) is KeyRange else self.state.get(encoded, ABSENT)
            )
        if write_set is not ANY_KEY:
            write_set.update(encode_key(table, key) for table, key in writes)
        try:
            status, result, error, written = execute(
                procedure,
                args,
                snapshot,
                write_set,
                self.defaults,
                batch.time_ms,
                txn_seed(batch.batch_id, index),
                in_log_order=not aria,
            )
        except _OutsideFence as outside:
            return outside.key
        self.outcomes.append(self._outcome(batch, index, request_id, proc, args, status, result, error))
        if status == COMMITTED:
            for encoded in sorted(written):
                table, key, value = written[encoded]
                if value is ABSENT:
                    self.state.pop(encoded, None)
                else:
                    self.state[encoded] = value
                self.changes.append((batch.batch_id, index, table, key, None if value is ABSENT else value))
        return None

    @staticmethod
    def _outcome(batch: Batch, index: int, request_id: str, proc, args, status, result, error) -> dict:
        result, steps = split_result(result)
        return {
            "id": request_id,
            "status": status,
            "batch": batch.batch_id,
            "txn": index,
            "restarts": restarts_of(args) if proc is not None else 0,
            "result": result,
            "error": error,
            **({"steps": steps} if steps is not None else {}),
        }

    def digest(self) -> int:
        return digest_pairs((key, encode_value(value)) for key, value in self.state.items())


class _StateRanges:
    """A declared range read from the dictionary (docs/keys.md), as a worker reads it from
    its overlay: any key in it, or all of its present keys in order."""

    def __init__(self, state: dict[bytes, Any]):
        self._state = state

    def get(self, key: bytes) -> Any:
        return self._state.get(key, ABSENT)

    def range_items(self, prefix: bytes) -> list[tuple[bytes, Any]]:
        return sorted((key, value) for key, value in self._state.items() if key.startswith(prefix))


class _Watched(dict):
    """A snapshot that notes each key RUN reads from it; with `fetch`, it holds every key."""

    def __init__(self, read: set, fetch):
        super().__init__()
        self._read, self._fetch = read, fetch

    def __getitem__(self, key):
        if self._fetch is not None and not dict.__contains__(self, key):
            dict.__setitem__(self, key, self._fetch(key))
        value = dict.__getitem__(self, key)
        self._read.add(key)
        return value

    def get(self, key, default=None):
        return self[key] if self._fetch is not None or dict.__contains__(self, key) else default


class _WatchedRange:
    """A declared range whose every read is noted as a read of the range."""

    def __init__(self, ranges: "_StateRanges", key: bytes, read: set):
        self._ranges, self._key, self._read = ranges, key, read

    def get(self, key: bytes):
        self._read.add(self._key)
        return self._ranges.get(key)

    def range_items(self, prefix: bytes):
        self._read.add(self._key)
        return self._ranges.range_items(prefix)


class _OutsideFence(BaseException):
    def __init__(self, key: bytes):
        self.key = key


class _Fenced(dict):
    """The locked keys of a procedure without ANALYZE; any other read leaves the fence."""

    def __missing__(self, key):
        raise _OutsideFence(key)


class _FencedWrites(set):
    def __contains__(self, key) -> bool:
        if set.__contains__(self, key):
            return True
        raise _OutsideFence(key)
