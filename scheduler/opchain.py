"""TStream's operation chains.

Each stretch of single-partition transactions (normally the whole batch) is evaluated in
two phases, as in TStream's dual-mode scheduling.

1. Decompose. Every transaction becomes per-key operations (procedures/operations.py),
   grouped into one entry per key it touches, and each entry is appended to its key's
   chain; transactions are taken in log order, so every chain is ordered by txn index.
   A transaction T may need other keys' values — the keys of its conditions and of its
   READ_MODIFY dependencies — as they stand just before T in log order, never "the
   latest". Those are its recorded cross-chain dependencies: T gets an entry on each such
   key's chain too (an empty probe where it writes nothing there).

2. Evaluate. A chain starts from its key's value in the overlay (read once), walks its
   entries applying their operations, and its final value, if it changed, is written
   back once: a hot key costs one read and one write per stretch however many
   transactions hit it. When a chain reaches T's entry on a key T depends on, it
   publishes its current value as T's version of that key — per-batch multi-versioning,
   kept only where a dependency asks for it — and walks on. An entry that needs versions
   (every entry of a transaction with a condition, and any entry whose functions read
   other keys) parks its chain until T has all of them. Round one walks every chain as
   far as it goes: chains without a pending dependency run to their end; each later
   round resumes the chains whose awaited versions were published in the round before.
   An entry only ever waits for chains to reach its own transaction, never a later one,
   so some chain can always move: no deadlock. The result does not depend on the order
   in which chains are walked (tests shuffle it, standing in for TStream's parallel
   executors).

Aborts are atomic across chains: T's condition is decided once, from its versions,
before any entry of T that writes has passed, and every entry of T obeys that one
decision. A chain that moves past an aborted T carries on from the value it had before T,
so nothing later ever sees T's writes.

A procedure without an operation form (or whose form does not fit the declared sets for
the given arguments) runs whole: it has an entry on each of its keys, all gated, so it
waits at the head of every chain it touches until each has published its version; then
RUN runs once through `execute` on those versions, and each chain continues from the
value RUN wrote there.

Escape hatch: if an operation function, condition or result function raises, or yields
a value storage cannot hold or a result an outcome cannot carry (the checks of
`execution.stored_value` and `execution.result_problem`, which RUN's path applies too) —
cases in which RUN would abort with its own error text —
nothing of the chains has reached the overlay yet, so the stretch is dropped and its
transactions run one by one through RUN instead (counted in `fallbacks`).

Multi-partition transactions, for now: the batch is cut at each of them. The stretch
before it is evaluated and written back, then it runs through Calvin's protocol
(`execution.run`) on the overlay exactly at its log position, as the serial scheduler
runs it, and the next stretch starts from the overlay it left. Equivalence holds because
every stretch and every cut-point transaction sees precisely the state its predecessors
in log order left.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from ordo.procedures.args import WIRE_INT_MAX, WIRE_INT_MIN
from ordo.procedures.operations import OP_MODIFY, OP_READ, OP_WRITE, as_operations
from ordo.procedures.streams import OUTPUT_TABLE_PREFIX
from ordo.scheduler.base import Scheduler, in_log_order, register
from ordo.scheduler.batch import BatchExecution, Outcome, PreparedTxn
from ordo.scheduler.execution import ABORTED, COMMITTED, execute, result_problem, stored_value
from ordo.storage.keys import KeyRange, encode_key, is_range_key, ranges_seen
from ordo.storage.overlay import ABSENT

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


class _Txn:
    """One transaction's state while its chains are evaluated."""

    __slots__ = (
        "txn",
        "ops",
        "deps",
        "result",
        "whole",
        "conditions",
        "missing",
        "versions",
        "parked",
        "aborted",
        "outputs",
        "changes",
        "outcome",
        "writes",
    )

    def __init__(self, txn: PreparedTxn):
        self.txn = txn
        self.ops: list = ()  # the operation form's operations
        self.deps: dict[int, list] = {}  # operation position -> [(encoded, default)] it reads
        self.result = None  # result function of the operation form
        self.whole = False
        self.conditions: list = []  # (test, reason, [(encoded, default), ...])
        self.missing = 0  # versions not yet published
        self.versions: dict[bytes, Any] = {}
        self.parked: list[bytes] = []  # chains halted at one of its entries
        self.aborted: str | None = None
        self.outputs: list | None = None  # only when a result function reads them
        self.changes: list[tuple] = []  # (encoded, table, key, value)
        self.outcome: tuple | None = None  # (status, result, error)
        self.writes: dict = {}  # RUN's writes, for a transaction run whole


# An entry — one transaction's part of one chain — is a tuple
#   (txn state, ops, gated, publishes)
# ops: the position of its one operation in the form (the common case, kept as a bare int
# to spare an object per operation), a list of positions when the transaction names the
# key more than once, PROBE when it only reads the key's version, WHOLE when it runs RUN.
# gated: it may not pass before its transaction has every version it needs.
# publishes: its transaction needs this key's version.
PROBE = ()
WHOLE = None


def _decompose(txn: PreparedTxn, state: _Txn, defaults: dict) -> tuple | None:
    """Fill `state` from `txn`'s operation form and return (operations by key, keys whose
    operations read other keys, needed keys), or None when it must run whole. Every key the
    form names must be declared by ANALYZE as RUN would use it (reads in the read set,
    writes in the write set), else RUN decides — and reports the undeclared access."""
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
    per_key: dict[bytes, int | list] = {}
    dependent: set[bytes] = set()
    needs: dict[bytes, tuple] = {}
    conditions: list = []
    seen_conditions: list = []
    dep_lists: dict[int, list] = {}
    i = 0
    try:
        for kind, table, key, _, deps, condition in form.ops:
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
                dep_keys = dep_lists[i] = []
                for dep_table, dep_key in deps:
                    dep = encode(dep_table, dep_key)
                    if dep not in reads:
                        return None
                    needs[dep] = (dep_table, dep_key)
                    dep_keys.append((dep, defaults.get(dep_table, 0)))
                dependent.add(encoded)
            seen = per_key.get(encoded)
            if seen is None:
                per_key[encoded] = i
            elif type(seen) is int:
                per_key[encoded] = [seen, i]
            else:
                seen.append(i)
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
    state.ops = form.ops
    state.deps = dep_lists
    state.conditions = conditions
    if form.result is not None:
        state.result = form.result
        state.outputs = [None] * i
    state.missing = len(needs)
    return per_key, dependent, needs


class _Evaluation:
    """The chains of one stretch of single-partition transactions."""

    def __init__(self, execution: BatchExecution, shuffle: random.Random | None = None):
        self.execution = execution
        self.defaults = execution.defaults
        self.shuffle = shuffle
        self.chains: dict[bytes, list] = {}  # key -> its entries, in log order
        self.values: dict[bytes, Any] = {}  # key -> value where its chain stands
        self.positions: dict[bytes, int] = {}  # parked chain -> index of its waiting entry
        self.dirty: set[bytes] = set()
        self.states: list[_Txn] = []
        self.woken: list[bytes] = []  # chains to resume in the next round
        self.rounds = 0

    def add(self, txn: PreparedTxn) -> None:
        """Phase 1 for one transaction: its entries, appended to their chains."""
        state = _Txn(txn)
        self.states.append(state)
        chains = self.chains
        decomposed = _decompose(txn, state, self.defaults)
        if decomposed is None:
            state.whole = True
            keys = dict.fromkeys(txn.reads)
            keys.update(dict.fromkeys(txn.writes))
            state.missing = len(keys)
            if not keys:
                self._resolve(state)  # declares no keys: RUN has nothing to wait for
                return
            entry = (state, WHOLE, True, True)
            for encoded in keys:
                chain = chains.get(encoded)
                if chain is None:
                    chains[encoded] = [entry]
                else:
                    chain.append(entry)
            return
        per_key, dependent, needs = decomposed
        gate_all = bool(state.conditions)
        for encoded, ops in per_key.items():
            entry = (state, ops, gate_all or encoded in dependent, encoded in needs)
            chain = chains.get(encoded)
            if chain is None:
                chains[encoded] = [entry]
            else:
                chain.append(entry)
        if needs:
            probe = (state, PROBE, False, True)
            for encoded in needs:
                if encoded not in per_key:  # publishes the version, changes nothing
                    chain = chains.get(encoded)
                    if chain is None:
                        chains[encoded] = [probe]
                    else:
                        chain.append(probe)
        elif gate_all:
            self._resolve(state)  # conditions over no key at all

    def evaluate(self) -> None:
        """Phase 2: round one walks every chain from its start; each later round resumes
        the chains whose awaited versions were all published in the round before."""
        chains, shuffle, walk = self.chains, self.shuffle, self._walk
        order = list(chains.items())
        if shuffle is not None:
            shuffle.shuffle(order)
        read = self.execution.overlay.get
        self.rounds = 1
        for encoded, entries in order:
            walk(encoded, entries, 0, read(encoded), False)
        positions, values = self.positions, self.values
        while self.woken:
            self.rounds += 1
            woken, self.woken = self.woken, []
            if shuffle is not None:
                shuffle.shuffle(woken)
            for encoded in woken:
                walk(encoded, chains[encoded], positions.pop(encoded), values[encoded], True)
        if positions:
            raise RuntimeError(f"opchain: {len(positions)} chain(s) never resumed")

    def _walk(self, encoded: bytes, entries: list, pos: int, value: Any, resumed: bool) -> None:
        """Move one chain along as far as it goes."""
        start = value
        end = len(entries)
        defaults = self.defaults
        try:
            while pos < end:
                state, ops, gated, publishes = entries[pos]
                if resumed:
                    resumed = False  # its version was published before it parked
                elif publishes:
                    state.versions[encoded] = value
                    state.missing -= 1
                    if state.missing == 0:
                        self._resolve(state)
                if gated and state.missing:
                    self.positions[encoded] = pos
                    state.parked.append(encoded)
                    break
                pos += 1
                if ops is WHOLE:
                    written = state.writes.get(encoded)
                    if written is not None:
                        value = written[2]
                    continue
                if ops is PROBE or state.aborted is not None:
                    continue  # the chain carries on from the value it had
                outputs = state.outputs
                wrote = False
                for i in (ops,) if type(ops) is int else ops:
                    kind, table, key, arg, deps, _ = state.ops[i]
                    if kind == OP_MODIFY:
                        own = value if type(value) in _SCALARS else _view(value, defaults.get(table, 0))
                        if deps:
                            versions = state.versions
                            value = arg(own, *[_view(versions[dep], default) for dep, default in state.deps[i]])
                        else:
                            value = arg(own)
                        # What ctx.write does: a value RUN could not write makes RUN decide.
                        if type(value) is not int or not WIRE_INT_MIN <= value <= WIRE_INT_MAX:
                            value = stored_value(value)
                    elif kind == OP_WRITE:
                        value = stored_value(arg)
                    else:
                        if outputs is not None:
                            outputs[i] = _view(value, defaults.get(table, 0))
                        continue
                    wrote = True
                    if outputs is not None:
                        outputs[i] = value
                if wrote:
                    state.changes.append((encoded, table, key, value))
        except FormFailed:
            raise
        except Exception as exc:  # an operation function's fault
            raise FormFailed(f"{type(exc).__name__}: {exc}") from exc
        self.values[encoded] = value
        if value is not start:  # values are never mutated in place: identity says changed
            self.dirty.add(encoded)

    def _resolve(self, state: _Txn) -> None:
        """Every version `state` needs is published: decide it, then let its chains go on."""
        txn = state.txn
        versions = state.versions
        if state.whole:
            snapshot = {key: versions[key] for key in txn.reads}
            status, result, error, writes = execute(
                txn.procedure,
                txn.args,
                snapshot,
                txn.writes,
                self.defaults,
                txn.time_ms,
                txn.seed,
            )
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
            self.woken.extend(state.parked)
            state.parked = []

    def decide(self) -> None:
        """Every entry has passed: each transaction's outcome, before anything is written."""
        for state in self.states:
            if state.whole:
                continue  # decided by RUN in _resolve
            if state.aborted is not None:
                state.outcome = (ABORTED, None, state.aborted)
                continue
            result = None
            if state.result is not None:
                outputs = [v if type(v) in _SCALARS else copy.deepcopy(v) for v in state.outputs]
                try:
                    result = state.result(outputs)
                except Exception as exc:
                    raise FormFailed(f"{state.txn.procedure.name}: result raised {type(exc).__name__}") from exc
                # Chains have moved past this transaction with its writes, so it cannot
                # abort here: RUN decides the stretch, and execute aborts it as every
                # other scheduler does.
                if result_problem(result) is not None:
                    raise FormFailed(f"{state.txn.procedure.name}: result cannot be published")
            state.outcome = (COMMITTED, result, None)

    def flush(self) -> None:
        """Write each changed key once, and report outcomes and changes in log order."""
        put, values = self.execution.overlay.put, self.values
        for encoded in self.dirty:
            put(encoded, values[encoded])
        outcomes, changes = self.execution.outcomes, self.execution.changes
        first = len(changes)
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
        # Each of these transactions has all of its keys here, its output streams' rows too.
        self.execution.streamed += [
            change
            for change in changes[first:]
            if change[1].startswith(OUTPUT_TABLE_PREFIX) and type(change[3]) is list
        ]


def _declares_range(txn: PreparedTxn) -> bool:
    """A transaction over a declared range reads or writes keys no chain knows of: it runs
    at its log position between stretches, as a multi-partition one does."""
    return any(type(key) is KeyRange for _, key in txn.writes.values()) or any(map(is_range_key, txn.reads))


def _first(item: tuple) -> bytes:
    return item[0]


@register
class OpChainScheduler(Scheduler):
    name = "opchain"

    def __init__(self, shuffle_seed: int | None = None) -> None:
        # shuffle_seed: walk chains in a seeded random order each round (tests use it to
        # stand in for parallel executors picking chains in any order).
        self.shuffle = None if shuffle_seed is None else random.Random(shuffle_seed)
        self.fallbacks = 0  # stretches run through RUN because a form failed (diagnostics)
        self.rounds = 0  # evaluation rounds so far (diagnostics)

    async def run_batch(self, txns: list[PreparedTxn], execution: BatchExecution) -> None:
        stretch: list[PreparedTxn] = []
        ranged = ranges_seen()
        for txn in txns:
            if txn.single and not (ranged and _declares_range(txn)):
                stretch.append(txn)
                continue
            self._stretch(stretch, execution)
            stretch = []
            await execution.run(txn)
            if execution.exchange is not None:
                execution.exchange.flush()  # a peer may be waiting for what we just sent
        self._stretch(stretch, execution)
        in_log_order(execution)

    def _stretch(self, txns: list[PreparedTxn], execution: BatchExecution) -> None:
        if not txns:
            return
        evaluation = _Evaluation(execution, self.shuffle)
        try:
            for txn in txns:
                evaluation.add(txn)
            evaluation.evaluate()
            evaluation.decide()
        except FormFailed:
            self.fallbacks += 1
            run_single = execution.run_single
            for txn in txns:
                run_single(txn)
            return
        self.rounds += evaluation.rounds
        evaluation.flush()
