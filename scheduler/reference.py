"""The plain serial interpretation of a log: every request, one at a time, in log order,
over a dictionary. No overlay, no scheduler, no partitions: the yardstick every engine
configuration is checked against."""

from __future__ import annotations

from typing import Any, Iterable

from procedures.ollp import restarts_of
from procedures.registry import Registry, RequestError
from procedures.streams import split_result
from scheduler.execution import COMMITTED, REJECTED, execute, txn_seed
from sequencer.log import Batch
from storage.digest import digest_pairs
from storage.keys import KeyRange, encode_key
from storage.overlay import ABSENT, RangeView
from storage.values import encode_value


class SerialInterpreter:
    def __init__(self, registry: Registry):
        self.registry = registry
        self.defaults = {t.name: t.default for t in registry.tables.values()}
        self.state: dict[bytes, Any] = {}
        self.outcomes: list[dict[str, Any]] = []
        self.changes: list[tuple] = []  # (batch, txn index, table, key, value or None)
        self._ranges = _StateRanges(self.state)

    def apply(self, batches: Iterable[Batch]) -> "SerialInterpreter":
        for batch in batches:
            for index, (request_id, proc, args) in enumerate(batch.entries):
                self._one(batch, index, request_id, proc, args)
        return self

    def _one(self, batch: Batch, index: int, request_id: str, proc, args) -> None:
        def outcome(status, result=None, error=None):
            result, steps = split_result(result)
            self.outcomes.append({"id": request_id, "status": status, "batch": batch.batch_id, "txn": index,
                                  "restarts": restarts_of(args) if proc is not None else 0,
                                  "result": result, "error": error, **({"steps": steps} if steps is not None else {})})
        if proc is None:
            outcome(REJECTED, error=args)
            return
        try:
            procedure, reads, writes = self.registry.analyze(proc, args)
        except RequestError as exc:
            outcome(REJECTED, error=str(exc))
            return
        snapshot = {}
        for table, key in reads:
            encoded = encode_key(table, key)
            snapshot[encoded] = (RangeView(self._ranges, encoded) if type(key) is KeyRange
                                 else self.state.get(encoded, ABSENT))
        write_set = {encode_key(table, key) for table, key in writes}
        status, result, error, written = execute(procedure, args, snapshot, write_set, self.defaults,
                                                 batch.time_ms, txn_seed(batch.batch_id, index))
        outcome(status, result, error)
        if status == COMMITTED:
            for encoded in sorted(written):
                table, key, value = written[encoded]
                if value is ABSENT:
                    self.state.pop(encoded, None)
                else:
                    self.state[encoded] = value
                self.changes.append((batch.batch_id, index, table, key, None if value is ABSENT else value))

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
