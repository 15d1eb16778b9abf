"""A batch as one partition sees it: its transactions prepared (ANALYZE'd, keys encoded
and placed), and the execution state every scheduler drives: the overlay, the outcomes
this partition reports and the change data of its writes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ordo.procedures.fingerprint import refused_entry
from ordo.procedures.registry import Registry, RequestError, UnusableKey
from ordo.procedures.streams import OUTPUT_TABLE_PREFIX
from ordo.scheduler.execution import COMMITTED, REJECTED, execute, txn_seed
from ordo.log.records import ARIA, Batch
from ordo.storage.keys import encode_key
from ordo.storage.overlay import ABSENT, BatchOverlay
from ordo.sequencer.routing import own_part, reporter_of_rejected, slice_of, writers
from ordo.storage.partitioning import Partitioner, executor_of, place


@dataclass(slots=True)
class PreparedTxn:
    """A transaction as one partition runs it. A multi-partition one may come with its
    keys in the routing (sequencer/routing.py) and is then not analyzed here: `reads`
    holds this partition's own reads only and `writes` the keys RUN may write, without
    their (table, key) (None). On a participant that does not execute it, it is not even
    decoded: `procedure`, `args` and `id` are None and `writes` holds its own keys only."""

    index: int
    id: str | None
    procedure: Any
    args: dict | None
    reads: tuple[bytes, ...]  # the read set, encoded, in declared order (its own part if carried)
    writes: dict[bytes, tuple[str, Any] | None]  # the write set: encoded -> (table, key), or None if carried
    local_reads: tuple[bytes, ...]  # the part of the read set this partition owns
    participants: tuple[int, ...]  # partitions holding any of its keys, ascending
    active: tuple[int, ...]  # partitions that run RUN: those it writes (else its lowest)
    local_writes: tuple[bytes, ...] = ()  # the part of the write set this partition owns (multi-partition)
    owners: dict[bytes, int] | None = None  # carried, on the executor: each written key -> its owner
    declared: bool = True  # False: a procedure without ANALYZE (aria batches), no sets to keep to
    # Its batch; in a round of several batches (scheduler/round.py) `index` is its place in
    # the round, `offset` more than its entry's index in its batch.
    batch_id: int = 0
    time_ms: int = 0
    offset: int = 0

    @property
    def single(self) -> bool:
        return len(self.participants) == 1

    @property
    def entry(self) -> int:
        """Its entry's index in its batch: what every partition knows it by, whatever round
        it runs in."""
        return self.index - self.offset

    @property
    def executor(self) -> int:
        return executor_of(self.index - self.offset, self.active)

    @property
    def seed(self) -> int:
        return txn_seed(self.batch_id, self.index - self.offset)


@dataclass(slots=True)
class Outcome:
    index: int
    id: str
    status: str
    result: Any
    error: str | None
    restarts: int = 0  # how often a dependent transaction was re-sequenced (procedures/ollp.py)


ONLY = (0,)


def prepare(
    batch: Batch, registry: Registry, partitioner: Partitioner, partition: int
) -> tuple[list[PreparedTxn], list[Outcome]]:
    """The transactions of `batch` that involve `partition`, and the rejections this
    partition reports. With routing made for this partition count, only the entries of
    this partition's slice are decoded and analyzed; otherwise every entry is placed here
    (always in an aria batch: a transaction's home runs its RUN on its whole read set,
    which a carried routing item does not give; scheduler/aria.py)."""
    routing = batch.routing
    if routing is not None and routing[0] == partitioner.partitions and batch.ordering is None:
        txns, rejected = _prepare_slice(batch, slice_of(routing, partition), registry, partitioner, partition)
    else:
        txns, rejected = _prepare_all(batch, registry, partitioner, partition)
    batch_id, time_ms = batch.batch_id, batch.time_ms
    for txn in txns:
        txn.batch_id = batch_id
        txn.time_ms = time_ms
    return txns, rejected


def _prepare_slice(
    batch: Batch, items: list, registry: Registry, partitioner: Partitioner, partition: int
) -> tuple[list[PreparedTxn], list[Outcome]]:
    txns: list[PreparedTxn] = []
    rejected: list[Outcome] = []
    of = partitioner.of
    analyze = registry.analyze
    entry = batch.entry
    here = (partition,)
    for item in items:
        if type(item) is int:
            index, participants, active = item, here, here
        else:
            index, participants, active = item[0], tuple(item[1]), tuple(item[2])
            carried = own_part(item)
            if carried is not None:
                local_reads, local_writes = carried
                owners = writers(item, partition, local_writes)
                if owners is None:  # taking part without executing: the keys are all it needs
                    txns.append(
                        PreparedTxn(
                            index,
                            None,
                            None,
                            None,
                            local_reads,
                            dict.fromkeys(local_writes),
                            local_reads,
                            participants,
                            active,
                            local_writes,
                        )
                    )
                    continue
                request_id, proc, args = entry(index)
                try:
                    procedure = registry.procedure(proc)
                except RequestError as exc:
                    raise refused_entry(batch.batch_id, index, request_id, str(exc)) from None
                txns.append(
                    PreparedTxn(
                        index,
                        request_id,
                        procedure,
                        args,
                        local_reads,
                        dict.fromkeys(owners),
                        local_reads,
                        participants,
                        active,
                        local_writes,
                        owners,
                    )
                )
                continue
        request_id, proc, args = entry(index)
        if proc is None:
            rejected.append(Outcome(index, request_id, REJECTED, None, args))
            continue
        try:
            procedure, read_set, write_set = analyze(proc, args)
        except UnusableKey as exc:
            rejected.append(Outcome(index, request_id, REJECTED, None, str(exc)))
            continue
        except RequestError as exc:
            raise refused_entry(batch.batch_id, index, request_id, str(exc)) from None
        reads = tuple(encode_key(table, key) for table, key in read_set)
        writes = {encode_key(table, key): (table, key) for table, key in write_set}
        if len(participants) == 1:
            txns.append(PreparedTxn(index, request_id, procedure, args, reads, writes, reads, participants, active))
            continue
        local_reads = tuple(k for k, (table, key) in zip(reads, read_set) if of(table, key, k) == partition)
        local_writes = tuple(k for k, (table, key) in writes.items() if of(table, key, k) == partition)
        txns.append(
            PreparedTxn(
                index, request_id, procedure, args, reads, writes, local_reads, participants, active, local_writes
            )
        )
    return txns, rejected


def _prepare_all(
    batch: Batch, registry: Registry, partitioner: Partitioner, partition: int
) -> tuple[list[PreparedTxn], list[Outcome]]:
    txns: list[PreparedTxn] = []
    rejected: list[Outcome] = []
    partitions = partitioner.partitions
    single_partition = partitions == 1
    ordering = batch.ordering
    for index, (request_id, proc, args) in enumerate(batch.entries):
        if proc is None:
            if reporter_of_rejected(index, partitions) == partition:
                rejected.append(Outcome(index, request_id, REJECTED, None, args))
            continue
        try:
            procedure, read_set, write_set = registry.analyze(proc, args, ordering)
        except UnusableKey as exc:
            if reporter_of_rejected(index, partitions) == partition:
                rejected.append(Outcome(index, request_id, REJECTED, None, str(exc)))
            continue
        except RequestError as exc:
            raise refused_entry(batch.batch_id, index, request_id, str(exc)) from None
        if procedure.analyze is None and ordering == ARIA:
            # Known to every partition: whichever executes it in aria's fallback runs its RUN.
            home = (partitioner.of_key(*read_set[0]),)
            txns.append(PreparedTxn(index, request_id, procedure, args, (), {}, (), home, home, declared=False))
            continue
        reads = tuple(encode_key(table, key) for table, key in read_set)
        writes = {encode_key(table, key): (table, key) for table, key in write_set}
        if single_partition:
            txns.append(PreparedTxn(index, request_id, procedure, args, reads, writes, reads, ONLY, ONLY))
            continue
        participants, active = place(partitioner, read_set, write_set)
        if partition not in participants:
            continue
        of = partitioner.of
        local_reads = tuple(k for k, (table, key) in zip(reads, read_set) if of(table, key, k) == partition)
        local_writes = (
            ()
            if len(participants) == 1
            else tuple(k for k, (table, key) in writes.items() if of(table, key, k) == partition)
        )
        txns.append(
            PreparedTxn(
                index, request_id, procedure, args, reads, writes, local_reads, participants, active, local_writes
            )
        )
    return txns, rejected


class ReadExchange(Protocol):
    """How the participants of a multi-partition transaction share their local reads."""

    def send(self, batch_id: int, index: int, to: tuple[int, ...], values: dict[bytes, Any]) -> None: ...

    def flush(self) -> None:
        """Deliver what `send` may have held back to aggregate; called before waiting and
        at the end of a batch."""

    def when_received(
        self, batch_id: int, index: int, senders: int, callback: Callable[[dict[bytes, Any] | None], None]
    ) -> None:
        """Calls `callback` with the values `senders` peers sent for this transaction
        (merged), or with None if the exchange failed; always from the event loop, never
        from inside this call (scheduler/exchange.py, Mailbox)."""

    mailbox: Any  # scheduler.exchange.Mailbox: the receiving side, its `on_wait` and `failure`


def exchange_failed(exchange: ReadExchange) -> RuntimeError:
    return RuntimeError(f"the read exchange with a peer failed: {exchange.mailbox.failure!r}")


class BatchExecution:
    """Executes transactions of one batch on one partition. Schedulers decide the order
    and the overlap; this class does the same thing for every scheduler."""

    def __init__(
        self,
        batch: Batch,
        partition: int,
        overlay: BatchOverlay,
        defaults: dict[str, Any],
        writes_owner,
        exchange: ReadExchange | None = None,
        range_tables: dict[str, tuple[int, int]] | None = None,
        partitions: int = 1,
    ):
        self.batch = batch
        self.partitions = partitions
        self.range_tables = range_tables or {}  # table -> (range_by, partition_by): procedures/registry.py
        self.partition = partition
        self.overlay = overlay
        self.defaults = defaults
        self.owner = writes_owner  # (table, key, encoded) -> owning partition
        self.exchange = exchange
        self.outcomes: list[Outcome] = []
        self.changes: list[list] = []  # [txn index, table, key, value or None]
        # Tuples for output streams applied here, [txn index, table, key, tuples]: a stream's
        # row has one owner, which publishes them, so they reach its one-partition topic in
        # log order (scheduler/stream_outputs.py).
        self.streamed: list[list] = []

    def local_snapshot(self, txn: PreparedTxn) -> dict[bytes, Any]:
        get = self.overlay.get
        return {key: get(key) for key in txn.local_reads}

    def run_single(self, txn: PreparedTxn) -> None:
        """A transaction whose keys all live here: read, run, apply, in one step."""
        self.finish(txn, self.local_snapshot(txn))

    async def run(self, txn: PreparedTxn) -> None:
        """A multi-partition transaction runs RUN once, on its executor (one of its active
        participants). At the transaction's turn every other participant reads its local
        keys and sends them to the executor; the executor runs RUN on the complete read
        set, applies its own writes, and sends every other active participant its writes
        (none if it aborted), which each applies at the same turn. All reach the same
        state without a commit round, and RUN's work is not repeated on every writer.
        Schedulers that run one transaction at a time await this; those that keep many
        open use `begin`."""
        if txn.single:
            self.run_single(txn)
            return
        done = asyncio.get_running_loop().create_future()
        self.begin(txn, lambda: done.set_result(None), done.set_exception)
        self.exchange.flush()  # a peer may be waiting for what was just sent
        await done

    def begin(self, txn: PreparedTxn, finished: Callable[[], None], failed: Callable[[BaseException], None]) -> None:
        """`run` without a coroutine, for schedulers that keep many multi-partition
        transactions open at once: the local part now, the rest from the exchange's
        callback when the peers' values are in. Calls `finished` once the transaction is
        complete (never from inside this call), or `failed` with what went wrong."""
        batch_id, index, here = txn.batch_id, txn.entry, self.partition
        executor = txn.executor
        local = self.local_snapshot(txn)
        exchange = self.exchange
        if here != executor:
            exchange.send(batch_id, index, (executor,), local)
            if here not in txn.active:
                asyncio.get_running_loop().call_soon(finished)
                return

            def written(writes: dict | None) -> None:
                try:
                    if writes is None:
                        raise exchange_failed(exchange)
                    if writes:
                        self.apply(txn.index, writes)
                except BaseException as exc:
                    failed(exc)
                    return
                finished()

            exchange.when_received(batch_id, index, 1, written)
            return

        def complete(received: dict | None) -> None:
            try:
                if received is None:
                    raise exchange_failed(exchange)
                local.update(received)
                self._run_on_executor(txn, local)
            except BaseException as exc:
                failed(exc)
                return
            finished()

        exchange.when_received(batch_id, index, len(txn.participants) - 1, complete)

    def _run_on_executor(self, txn: PreparedTxn, snapshot: dict[bytes, Any]) -> None:
        batch_id, entry, index, here = txn.batch_id, txn.entry, txn.index, self.partition
        status, result, error, writes = self._execute(txn, snapshot)
        self.outcomes.append(Outcome(index, txn.id, status, result, error))
        others = tuple(p for p in txn.active if p != here)
        if status != COMMITTED or not writes:
            for peer in others:
                self.exchange.send(batch_id, entry, (peer,), {})
            return
        self.record(index, writes)
        by_owner: dict[int, dict[bytes, list]] = {p: {} for p in txn.active}
        owner, owners = self.owner, txn.owners or {}  # placed by the sequencer, if carried
        for encoded, write in writes.items():
            writer = owners.get(encoded)
            if writer is None:  # not carried, or written through a declared range
                writer = owner(write[0], write[1], encoded)
            by_owner[writer][encoded] = write
        for peer in others:
            self.exchange.send(batch_id, entry, (peer,), by_owner[peer])
        if by_owner[here]:
            self.apply(index, by_owner[here])

    def _execute(self, txn: PreparedTxn, snapshot: dict[bytes, Any]):
        return execute(
            txn.procedure,
            txn.args,
            snapshot,
            txn.writes,
            self.defaults,
            txn.time_ms,
            txn.seed,
        )

    def finish(self, txn: PreparedTxn, snapshot: dict[bytes, Any]) -> None:
        """Run a transaction whose keys are all here."""
        status, result, error, writes = self._execute(txn, snapshot)
        self.outcomes.append(Outcome(txn.index, txn.id, status, result, error))
        if status == COMMITTED and writes:
            self.apply(txn.index, writes)
            self.record(txn.index, writes)

    def apply(self, index: int, writes: dict[bytes, list]) -> None:
        """Apply writes of keys this partition owns."""
        put = self.overlay.put
        for encoded, (table, key, value) in writes.items():
            put(encoded, value)
            if table.startswith(OUTPUT_TABLE_PREFIX) and type(value) is list:
                self.streamed.append([index, table, key, value])

    def record(self, index: int, writes: dict[bytes, list]) -> None:
        """The change data of a transaction this partition reports: all of its writes, in
        key order, wherever they are applied, so a transaction's change data is the same
        at every partition count."""
        changes = self.changes
        for encoded in sorted(writes):
            table, key, value = writes[encoded]
            changes.append([index, table, key, None if value is ABSENT else value])
