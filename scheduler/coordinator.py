"""The coordinator: follows the log in order, hands each batch to the partition workers
(one call per batch per worker), publishes one outcome per request and the change data,
then has the workers apply the batch.

Outputs are flushed before the batch is applied, so a crash can only make a restart emit
a batch's outputs again (identically), never lose them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from confluent_kafka import Producer

from procedures.registry import Registry, default_registry
from scheduler.batch import Outcome
from scheduler.exchange import LocalExchange
from scheduler.execution import REJECTED
from scheduler.outputs import change_key, change_record, outcome_record
from scheduler.worker import PartitionResult, PartitionWorker, check_layout
from sequencer.kafka import kafka_config
from sequencer.log import Batch, LogCursor
from sequencer.reader import LogReader
from sequencer.topics import Topics

log = logging.getLogger("ordo.engine")


@dataclass(slots=True)
class EngineStats:
    batches: int = 0
    txns: int = 0
    committed: int = 0
    aborted: int = 0
    rejected: int = 0
    last_batch: int = 0


class Coordinator:
    def __init__(self, bootstrap: str, namespace: str, data_dir: str, scheduler: str = "serial",
                 partitions: int = 1, registry: Registry | None = None, sync: bool = False):
        check_layout(data_dir, partitions)
        self.topics = Topics(namespace)
        self.registry = registry or default_registry()
        self.stats = EngineStats()
        self._stop = threading.Event()
        exchange = LocalExchange()
        self.workers = [
            PartitionWorker(data_dir, p, partitions, scheduler, self.registry, exchange.endpoint(p), sync)
            for p in range(partitions)
        ]
        self.cursor = self._resume_cursor()
        self.stats.last_batch = self.cursor.next_batch - 1
        self._reader = LogReader(bootstrap, self.topics.log, self.cursor, f"{namespace}.engine")
        self._producer = Producer(kafka_config(bootstrap, {
            "enable.idempotence": True,
            "linger.ms": 2,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 1_000_000,
        }))
        self._loop = asyncio.new_event_loop()

    def _resume_cursor(self) -> LogCursor:
        markers = [w.applied() for w in self.workers]
        if all(m is None for m in markers):
            return LogCursor()
        batches = {m["batch"] if m else 0 for m in markers}
        if len(batches) != 1:
            raise RuntimeError(
                f"shards stopped at different batches {sorted(batches)}: restore them from a common checkpoint")
        return LogCursor.from_dict(markers[0]["cursor"])

    def stop(self) -> None:
        self._stop.set()

    def run(self, idle_exit: float | None = None, until_batch: int | None = None,
            progress=None) -> EngineStats:
        """Follow the log until stopped; with `idle_exit`, also stop after that many seconds
        without a new batch; with `until_batch`, stop once that batch is applied.
        `progress(stats)` is called after every poll."""
        last_progress = time.monotonic()
        try:
            while not self._stop.is_set():
                if until_batch is not None and self.stats.last_batch >= until_batch:
                    break
                batches = self._reader.poll(0.05)
                for batch, cursor in batches:
                    self.apply(batch, cursor)
                if batches:
                    last_progress = time.monotonic()
                elif idle_exit is not None and time.monotonic() - last_progress > idle_exit:
                    break
                if progress is not None:
                    progress(self.stats)
        finally:
            self.close()
        return self.stats

    def apply(self, batch: Batch, cursor: dict) -> None:
        results = self._loop.run_until_complete(self._execute(batch))
        self._publish(batch, results)
        marker = {"batch": batch.batch_id, "cursor": cursor}
        for worker in self.workers:
            worker.commit(marker)
        self.stats.batches += 1
        self.stats.last_batch = batch.batch_id

    async def _execute(self, batch: Batch) -> list[PartitionResult]:
        return await asyncio.gather(*(w.execute(batch) for w in self.workers))

    def _publish(self, batch: Batch, results: list[PartitionResult]) -> None:
        outcomes: list[Outcome] = [
            Outcome(index, request_id, REJECTED, None, error)
            for index, (request_id, proc, error) in enumerate(batch.entries)
            if proc is None
        ]
        for result in results:
            outcomes.extend(result.outcomes)
        outcomes.sort(key=lambda o: o.index)
        produce = self._producer.produce
        results_topic = self.topics.results
        stats = self.stats
        for outcome in outcomes:
            produce(results_topic, key=outcome.id.encode(), value=outcome_record(outcome, batch.batch_id))
            if outcome.status == "committed":
                stats.committed += 1
            elif outcome.status == "aborted":
                stats.aborted += 1
            else:
                stats.rejected += 1
        stats.txns += len(outcomes)
        for result in results:
            produce(self.topics.changes, key=change_key(batch.batch_id, result.partition),
                    value=change_record(batch.batch_id, result.partition, result.changes))
        remaining = self._producer.flush(60)
        if remaining:
            raise RuntimeError(f"{remaining} outputs of batch {batch.batch_id} not acknowledged by the broker")

    def log_lag(self) -> int | str:
        """Log records not yet read; for display only (some brokers misreport watermarks)."""
        return self._reader.lag()

    def close(self) -> None:
        self._reader.close()
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None
        for worker in self.workers:
            worker.close()
        self._loop.close()
