"""TStream's operation chains.

A batch is decomposed into per-key operations (procedures/operations.py). Every key the
batch touches gets one chain: the entries of the transactions that touch it, in log
order, each entry holding that transaction's operations on the key. A chain starts from
the key's value in the overlay (read once), walks its entries, and its final value is
written back once; so a hot key costs one read and one write per batch however many
transactions hit it.

Dependencies across chains. A transaction T may need other keys' values: the keys of its
conditions and of its READ_MODIFY dependencies. It needs them as they stand just before
T in log order, never "the latest". So T has an entry on every such key's chain too (an
empty probe if it does not write it), and when a chain reaches T's entry it publishes
its current value as T's version of that key: the per-batch multi-versioning, kept only
where a dependency asks for it. An entry of T that needs versions (any entry of a
transaction with a condition, or one whose functions read other keys) parks its chain
until T has them all; other chains run on, past T, meanwhile. Nothing ever waits for a
later transaction, so the earliest pending entry can always proceed: no deadlock.

Evaluation order: the first round walks every chain as far as it can go — chains with no
pending dependency run to the end; later rounds resume the chains that parked, as the
versions they wait for get published.

Aborts are atomic across chains: T's condition is decided once, from its versions, before
any of T's writing entries pass, and every entry of T obeys the one decision. A chain
that moves past an aborted T carries the value it had before T.

A procedure without an operation form (or whose form is unusable for the given arguments)
runs whole: it has an entry on each of its keys, waits at the head of all of them (it
needs every key's version), runs RUN through `execute` on those versions, and each chain
continues from the value RUN wrote.

Escape hatch: if an operation function, condition or result function raises, or yields
a value storage cannot hold — cases where RUN would abort with its own error text —
nothing of the chains has reached the overlay yet, so the scheduler drops them and runs
that stretch of transactions one by one through RUN instead.

Multi-partition transactions (for now): the batch is cut at each of them. The chains of
the stretch before it are evaluated and written back, then it runs through Calvin's
protocol (`execution.run`) on the overlay, exactly at its log position, as the serial
scheduler would run it; the next stretch starts from the overlay it left.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from typing import Any

from procedures.operations import OP_MODIFY, OP_READ, OP_WRITE, as_operations
from scheduler.base import Scheduler, in_log_order, register
from scheduler.batch import BatchExecution, Outcome, PreparedTxn
from scheduler.execution import ABORTED, COMMITTED, execute, txn_seed
from storage.keys import encode_key
from storage.overlay import ABSENT
from storage.values import encode_value

_SCALARS = (int, str, float, bool, type(None), bytes)


class FormFailed(Exception):
    """An operation form could not decide a transaction the way RUN would."""


def _view(value: Any, default: Any) -> Any:
    """A value as a function sees it: defaults for absent keys, private copies of structures."""
    if value is ABSENT:
        value = default
    if type(value) in _SCALARS:
        return value
    return copy.deepcopy(value)


def _stored(value: Any) -> Any:
    """A value a WRITE or READ_MODIFY produced, checked as ctx.write checks it."""
    if type(value) in _SCALARS:
        return value
    encode_value(value)
    return copy.deepcopy(value)


class _Txn:
    """One transaction's state while its chains are evaluated."""

    __slots__ = ("txn", "result", "whole", "conditions", "missing", "versions", "parked",
                 "aborted", "outputs", "left", "changes", "outcome", "writes")

    def __init__(self, txn: PreparedTxn):
        self.txn = txn
        self.result = None  # result function of the operation form
        self.whole = False
        self.conditions: list = []  # (test, reason, ((encoded, default), ...))
        self.missing = 0  # versions still to be published
        self.versions: dict[bytes, Any] = {}
        self.parked: list[bytes] = []  # chains halted at one of its entries
        self.aborted: str | None = None
        self.outputs: list | None = None
        self.left = 0  # entries not yet passed
        self.changes: list[tuple] = []  # (encoded, table, key, value)
        self.outcome: tuple | None = None  # (status, result, error)
        self.writes: dict = {}  # RUN's writes, for a transaction run whole


# An entry: one transaction's part of one chain.
#   (txn state, operations — None when run whole, () for a probe —, table, key,
#    gated: must wait until the transaction has all its versions,
#    publishes: the transaction needs this key's version)


def _decompose(txn: PreparedTxn, defaults: dict) -> tuple | None:
    """(operations by key, keys that read other keys, needed keys, conditions, result
    function, operation count) of `txn`, or None when it must run whole. Every key the form
    names must be declared by ANALYZE as RUN would use it (reads in the read set, writes in
    the write set), else RUN decides — and reports the undeclared access."""
    make = txn.procedure.operations
    if make is None:
        return None
    try:
        form = as_operations(make(txn.args))
    except Exception:
        return None
    writes = txn.writes
    reads = set(txn.reads)
    encode = encode_key
    per_key: dict[bytes, tuple] = {}  # encoded -> (table, key, [(position, kind, arg, deps)])
    dependent: set[bytes] = set()
    needs: dict[bytes, tuple] = {}
    conditions: list = []
    seen_conditions: list = []
    i = 0
    try:
        for kind, table, key, arg, deps, condition in form.ops:
            encoded = encode(table, key)
            if kind == OP_MODIFY:
                if encoded not in writes or encoded not in reads:
                    return None
            elif kind == OP_WRITE:
                if encoded not in writes:
                    return None
            elif kind != OP_READ or encoded not in reads:
                return None
            if deps:
                dep_keys = []
                for dep_table, dep_key in deps:
                    dep = encode(dep_table, dep_key)
                    if dep not in reads:
                        return None
                    needs[dep] = (dep_table, dep_key)
                    dep_keys.append((dep, defaults.get(dep_table, 0)))
                dependent.add(encoded)
                op = (i, kind, arg, dep_keys)
            else:
                op = (i, kind, arg, ())
            slot = per_key.get(encoded)
            if slot is None:
                per_key[encoded] = (table, key, [op])
            else:
                slot[2].append(op)
            if condition is not None and not any(c is condition for c in seen_conditions):
                seen_conditions.append(condition)
                keys = []
                for cond_table, cond_key in condition.keys:
                    cond = encode(cond_table, cond_key)
                    if cond not in reads:
                        return None
                    needs[cond] = (cond_table, cond_key)
                    keys.append((cond, defaults.get(cond_table, 0)))
                conditions.append((condition.test, condition.reason, keys))
            i += 1
    except (TypeError, ValueError, AttributeError):
        return None  # a malformed form: RUN decides
    return per_key, dependent, needs, conditions, form.result, i


_UNREAD = object()


class _Evaluation:
    """The chains of one stretch of single-partition transactions.

    A chain is its key's current value (read from the overlay when the chain starts)
    plus, while its head entry waits for versions, the queue of its entries from that
    one on. Entries arrive in log order. An entry whose chain has no queue and which
    needs nothing passes at once — the first round, in which every chain without a
    pending dependency is evaluated as far as it goes while the batch is decomposed. An
    entry that must wait parks its chain; when its transaction's last version is
    published, the chains parked on it resume (the later rounds)."""

    def __init__(self, execution: BatchExecution):
        self.execution = execution
        self.defaults = execution.defaults
        self.read = execution.overlay.get
        self.values: dict[bytes, Any] = {}  # chain -> current value
        self.queues: dict[bytes, deque] = {}  # parked chain -> its waiting entries
        self.dirty: set[bytes] = set()
        self.states: list[_Txn] = []
        self.work: deque[bytes] = deque()  # chains to resume

    def add(self, txn: PreparedTxn) -> None:
        """Decompose `txn` and insert its entries into their chains."""
        state = _Txn(txn)
        self.states.append(state)
        offer = self._offer
        decomposed = _decompose(txn, self.defaults)
        if decomposed is None:
            state.whole = True
            writes = txn.writes
            keys = dict.fromkeys(txn.reads)
            keys.update(dict.fromkeys(writes))
            state.missing = state.left = len(keys)
            for encoded in keys:
                table, key = writes.get(encoded, (None, None))
                offer(encoded, (state, None, table, key, True, True))
        else:
            per_key, dependent, needs, conditions, result, count = decomposed
            state.conditions = conditions
            state.result = result
            state.outputs = [None] * count
            state.missing = len(needs)
            gate_all = bool(conditions)
            probes = [encoded for encoded in needs if encoded not in per_key]
            state.left = len(per_key) + len(probes)
            if gate_all and not needs:
                self._resolve(state)  # conditions over no key at all
            queues, values, read, apply = self.queues, self.values, self.read, self._apply
            for encoded, (table, key, ops) in per_key.items():
                gated = gate_all or encoded in dependent
                publishes = encoded in needs
                if gated or publishes or encoded in queues:
                    offer(encoded, (state, ops, table, key, gated, publishes))
                    continue
                # The common case, inline: a free chain and an entry that needs nothing.
                value = values.get(encoded, _UNREAD)
                if value is _UNREAD:
                    value = read(encoded)
                values[encoded] = apply(state, encoded, table, key, ops, value)
                state.left -= 1
                if state.left == 0:
                    self._finish(state)
            for encoded in probes:  # publish a version, change nothing
                table, key = needs[encoded]
                offer(encoded, (state, (), table, key, False, True))
        work = self.work
        while work:
            self._resume(work.popleft())

    def _offer(self, encoded: bytes, entry: tuple) -> None:
        queue = self.queues.get(encoded)
        if queue is not None:
            queue.append(entry)
        elif not self._step(encoded, entry, True):
            self.queues[encoded] = deque((entry,))

    def _resume(self, encoded: bytes) -> None:
        queue = self.queues[encoded]
        fresh = False  # the head published its version before it parked
        while queue:
            if not self._step(encoded, queue[0], fresh):
                return
            queue.popleft()
            fresh = True
        del self.queues[encoded]

    def _step(self, encoded: bytes, entry: tuple, fresh: bool) -> bool:
        """Pass `entry`, at the head of its chain; False if it must wait."""
        state, ops, table, key, gated, publishes = entry
        values = self.values
        value = values.get(encoded, _UNREAD)
        if value is _UNREAD:
            value = values[encoded] = self.read(encoded)
        if fresh and publishes:
            state.versions[encoded] = value
            state.missing -= 1
            if state.missing == 0:
                self._resolve(state)
        if gated and state.missing:
            state.parked.append(encoded)
            return False
        if ops is None:
            written = state.writes.get(encoded)
            if written is not None:
                values[encoded] = written[2]
                self.dirty.add(encoded)
        elif ops and state.aborted is None:
            values[encoded] = self._apply(state, encoded, table, key, ops, value)
        state.left -= 1
        if state.left == 0:
            self._finish(state)
        return True

    def _apply(self, state: _Txn, encoded: bytes, table: str, key: Any, ops: list, value: Any) -> Any:
        default = self.defaults.get(table, 0)
        outputs = state.outputs
        versions = state.versions
        wrote = False
        try:
            for i, kind, arg, deps in ops:
                if kind == OP_MODIFY:
                    own = value if type(value) in _SCALARS else _view(value, default)
                    if deps:
                        value = arg(own, *[_view(versions[dep], dep_default) for dep, dep_default in deps])
                    else:
                        value = arg(own)
                    if type(value) not in _SCALARS:
                        encode_value(value)
                    outputs[i] = value
                    wrote = True
                elif kind == OP_WRITE:
                    value = outputs[i] = _stored(arg)
                    wrote = True
                else:
                    outputs[i] = _view(value, default)
        except Exception as exc:
            raise FormFailed(f"{state.txn.procedure.name}: {type(exc).__name__}: {exc}") from exc
        if wrote:
            state.changes.append((encoded, table, key, value))
            self.dirty.add(encoded)
        return value

    def _resolve(self, state: _Txn) -> None:
        """Every version `state` needs is published: decide it, then let its chains go on."""
        txn = state.txn
        versions = state.versions
        if state.whole:
            execution = self.execution
            snapshot = {key: versions[key] for key in txn.reads}
            status, result, error, writes = execute(
                txn.procedure, txn.args, snapshot, txn.writes, self.defaults,
                execution.batch.time_ms, txn_seed(execution.batch.batch_id, txn.index))
            state.outcome = (status, result, error)
            if status == COMMITTED:
                state.writes = writes
        else:
            for test, reason, keys in state.conditions:
                values = [_view(versions[key], default) for key, default in keys]
                try:
                    holds = test(*values)
                except Exception as exc:
                    raise FormFailed(f"{txn.procedure.name}: condition raised {type(exc).__name__}") from exc
                if not holds:
                    state.aborted = reason
                    break
        if state.parked:
            self.work.extend(state.parked)
            state.parked = []

    def _finish(self, state: _Txn) -> None:
        if state.whole:
            return  # decided by RUN in _resolve
        if state.aborted is not None:
            state.outcome = (ABORTED, None, state.aborted)
            return
        result = None
        if state.result is not None:
            outputs = [v if type(v) in _SCALARS else copy.deepcopy(v) for v in state.outputs]
            try:
                result = state.result(outputs)
                if type(result) not in _SCALARS or type(result) is bytes:
                    json.dumps(result, allow_nan=False)
            except Exception as exc:
                raise FormFailed(f"{state.txn.procedure.name}: result raised {type(exc).__name__}") from exc
        state.outcome = (COMMITTED, result, None)

    def check_done(self) -> None:
        if self.queues or any(state.left for state in self.states):
            raise RuntimeError(f"opchain: {len(self.queues)} chain(s) still parked at the end of a stretch")

    def flush(self) -> None:
        """Write each changed key once, and report outcomes and changes in log order."""
        put, values = self.execution.overlay.put, self.values
        for encoded in self.dirty:
            put(encoded, values[encoded])
        outcomes, changes = self.execution.outcomes, self.execution.changes
        for state in self.states:
            txn = state.txn
            index = txn.index
            status, result, error = state.outcome
            outcomes.append(Outcome(index, txn.id, status, result, error))
            if status != COMMITTED:
                continue
            if state.whole:
                written = state.writes
                for encoded in sorted(written):
                    table, key, value = written[encoded]
                    changes.append([index, table, key, None if value is ABSENT else value])
            elif state.changes:
                for _, table, key, value in sorted(state.changes, key=_first):
                    changes.append([index, table, key, None if value is ABSENT else value])


def _first(item: tuple) -> bytes:
    return item[0]


@register
class OpChainScheduler(Scheduler):
    name = "opchain"

    def __init__(self) -> None:
        self.fallbacks = 0  # stretches run through RUN because a form failed (diagnostics)

    async def run_batch(self, txns: list[PreparedTxn], execution: BatchExecution) -> None:
        stretch: list[PreparedTxn] = []
        for txn in txns:
            if txn.single:
                stretch.append(txn)
                continue
            self._stretch(stretch, execution)
            stretch = []
            await execution.run(txn)
        self._stretch(stretch, execution)
        in_log_order(execution)

    def _stretch(self, txns: list[PreparedTxn], execution: BatchExecution) -> None:
        if not txns:
            return
        evaluation = _Evaluation(execution)
        try:
            for txn in txns:
                evaluation.add(txn)
        except FormFailed:
            self.fallbacks += 1
            run_single = execution.run_single
            for txn in txns:
                run_single(txn)
            return
        evaluation.check_done()
        evaluation.flush()
