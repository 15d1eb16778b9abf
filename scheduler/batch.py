"""A batch as one partition sees it: its transactions prepared (ANALYZE'd, keys encoded
and placed), and the execution state every scheduler drives: the overlay, the outcomes
this partition reports and the change data of its writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from procedures.registry import Registry, RequestError
from scheduler.execution import COMMITTED, REJECTED, execute, txn_seed
from sequencer.log import Batch
from storage.keys import encode_key
from storage.overlay import ABSENT, BatchOverlay
from sequencer.routing import reporter_of_rejected
from storage.partitioning import Partitioner, place


@dataclass(slots=True)
class PreparedTxn:
    index: int
    id: str
    procedure: Any
    args: dict
    reads: tuple[bytes, ...]  # the whole read set, encoded, in declared order
    writes: dict[bytes, tuple[str, Any]]  # the whole write set: encoded -> (table, key)
    local_reads: tuple[bytes, ...]  # the part of the read set this partition owns
    participants: tuple[int, ...]  # partitions holding any of its keys, ascending
    active: tuple[int, ...]  # partitions that run RUN: those it writes (else its lowest)

    @property
    def single(self) -> bool:
        return len(self.participants) == 1

    @property
    def reporter(self) -> int:
        return self.active[0]


@dataclass(slots=True)
class Outcome:
    index: int
    id: str
    status: str
    result: Any
    error: str | None


ONLY = (0,)


def prepare(batch: Batch, registry: Registry, partitioner: Partitioner,
            partition: int) -> tuple[list[PreparedTxn], list[Outcome]]:
    """The transactions of `batch` that involve `partition`, and the rejections this
    partition reports. With routing made for this partition count, only the entries of
    this partition's slice are decoded and analyzed; otherwise every entry is placed here."""
    routing = batch.routing
    if routing is not None and routing[0] == partitioner.partitions:
        return _prepare_slice(batch, routing[1][partition], registry, partitioner, partition)
    return _prepare_all(batch, registry, partitioner, partition)


def _prepare_slice(batch: Batch, items: list, registry: Registry, partitioner: Partitioner,
                   partition: int) -> tuple[list[PreparedTxn], list[Outcome]]:
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
        request_id, proc, args = entry(index)
        if proc is None:
            rejected.append(Outcome(index, request_id, REJECTED, None, args))
            continue
        try:
            procedure, read_set, write_set = analyze(proc, args)
        except RequestError as exc:
            if active[0] == partition:
                rejected.append(Outcome(index, request_id, REJECTED, None, str(exc)))
            continue
        reads = tuple(encode_key(table, key) for table, key in read_set)
        writes = {encode_key(table, key): (table, key) for table, key in write_set}
        if len(participants) == 1:
            local_reads = reads
        else:
            local_reads = tuple(k for k, (table, key) in zip(reads, read_set) if of(table, key, k) == partition)
        txns.append(PreparedTxn(index, request_id, procedure, args, reads, writes, local_reads, participants, active))
    return txns, rejected


def _prepare_all(batch: Batch, registry: Registry, partitioner: Partitioner,
                 partition: int) -> tuple[list[PreparedTxn], list[Outcome]]:
    txns: list[PreparedTxn] = []
    rejected: list[Outcome] = []
    partitions = partitioner.partitions
    single_partition = partitions == 1
    for index, (request_id, proc, args) in enumerate(batch.entries):
        if proc is None:
            if reporter_of_rejected(index, partitions) == partition:
                rejected.append(Outcome(index, request_id, REJECTED, None, args))
            continue
        try:
            procedure, read_set, write_set = registry.analyze(proc, args)
        except RequestError as exc:
            if reporter_of_rejected(index, partitions) == partition:
                rejected.append(Outcome(index, request_id, REJECTED, None, str(exc)))
            continue
        reads = tuple(encode_key(table, key) for table, key in read_set)
        writes = {encode_key(table, key): (table, key) for table, key in write_set}
        if single_partition:
            txns.append(PreparedTxn(index, request_id, procedure, args, reads, writes, reads, ONLY, ONLY))
            continue
        participants, active, placed = place(partitioner, reads, read_set, writes)
        if partition not in participants:
            continue
        local_reads = tuple(k for k in reads if placed[k] == partition)
        txns.append(PreparedTxn(index, request_id, procedure, args, reads, writes,
                                local_reads, participants, active))
    return txns, rejected


class ReadExchange(Protocol):
    """How the participants of a multi-partition transaction share their local reads."""

    def send(self, batch_id: int, index: int, to: tuple[int, ...], values: dict[bytes, Any]) -> None: ...

    def flush(self) -> None:
        """Deliver what `send` may have held back to aggregate; called before waiting and
        at the end of a batch."""

    async def receive(self, batch_id: int, index: int, senders: int) -> dict[bytes, Any]: ...


class BatchExecution:
    """Executes transactions of one batch on one partition. Schedulers decide the order
    and the overlap; this class does the same thing for every scheduler."""

    def __init__(self, batch: Batch, partition: int, overlay: BatchOverlay,
                 defaults: dict[str, Any], writes_owner, exchange: ReadExchange | None = None):
        self.batch = batch
        self.partition = partition
        self.overlay = overlay
        self.defaults = defaults
        self.owner = writes_owner  # (table, key, encoded) -> owning partition
        self.exchange = exchange
        self.outcomes: list[Outcome] = []
        self.changes: list[list] = []  # [txn index, table, key, value or None]

    def local_snapshot(self, txn: PreparedTxn) -> dict[bytes, Any]:
        get = self.overlay.get
        return {key: get(key) for key in txn.local_reads}

    def run_single(self, txn: PreparedTxn) -> None:
        """A transaction whose keys all live here: read, run, apply, in one step."""
        self.finish(txn, self.local_snapshot(txn))

    async def run(self, txn: PreparedTxn) -> None:
        """Calvin's protocol: every participant reads its local keys at the transaction's
        turn and sends them to the active participants, which run it on the full read
        set and apply only their own writes. All reach the same decision, no commit round."""
        if txn.single:
            self.run_single(txn)
            return
        local = self.local_snapshot(txn)
        peers = tuple(p for p in txn.active if p != self.partition)
        if peers:
            self.exchange.send(self.batch.batch_id, txn.index, peers, local)
        if self.partition not in txn.active:
            return
        senders = sum(1 for p in txn.participants if p != self.partition)
        remote = await self.exchange.receive(self.batch.batch_id, txn.index, senders)
        local.update(remote)
        self.finish(txn, local)

    def finish(self, txn: PreparedTxn, snapshot: dict[bytes, Any]) -> None:
        status, result, error, writes = execute(
            txn.procedure, txn.args, snapshot, txn.writes, self.defaults,
            self.batch.time_ms, txn_seed(self.batch.batch_id, txn.index))
        if txn.reporter == self.partition:
            self.outcomes.append(Outcome(txn.index, txn.id, status, result, error))
        if status == COMMITTED and writes:
            self.apply(txn.index, writes, txn.single)

    def apply(self, index: int, writes: dict[bytes, list], local_only: bool) -> None:
        put = self.overlay.put
        partition = self.partition
        for encoded in sorted(writes):
            table, key, value = writes[encoded]
            if not local_only and self.owner(table, key, encoded) != partition:
                continue
            put(encoded, value)
            self.changes.append([index, table, key, None if value is ABSENT else value])
