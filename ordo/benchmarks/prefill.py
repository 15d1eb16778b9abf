"""A pre-filled log: requests produced and sequenced before any engine runs, read back."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ordo.benchmarks.defaults import PREFILL_DELAY_MS
from ordo.benchmarks.requests import encode_requests


@dataclass
class Log:
    namespace: str
    requests: list[dict]
    batch_size: int
    last_batch: int
    records: list[tuple[int, bytes]] = field(default_factory=list, repr=False)  # (offset, raw) of <ns>.log

    def batches(self) -> list[tuple[Any, dict]]:
        """The accepted batches, each with the cursor after it, decoded afresh (runs never
        share Batch objects)."""
        from ordo.log.records import LogCursor

        cursor, out = LogCursor(namespace=self.namespace), []
        for offset, value in self.records:
            batch = cursor.accept(value, offset)
            if batch is not None:
                out.append((batch, cursor.to_dict()))
        return out


def new_namespace(kind: str) -> str:
    return f"bench-{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, namespace: str, encoded: list[tuple[str, bytes]]) -> None:
    from ordo.client import Client

    client = Client(bootstrap, namespace)
    client.submit(encoded)
    client.close()


def prefill_log(
    bootstrap: str,
    requests: list[dict],
    batch_size: int,
    kind: str,
    partitions: int = 1,
    ordering: str | None = None,
    modules: tuple[str, ...] = (),
) -> Log:
    """Requests produced to <ns>.requests (one partition), sequenced into <ns>.log with
    routing for `partitions` (or stamped with `ordering`: ordering_of in
    ordo/benchmarks/requests.py), with the procedures of `modules` (default: the built-in
    workloads), and the log's records read back."""
    from ordo.embedded import SequencerThread
    from ordo.log.records import LogCursor
    from ordo.log.reader import LogReader
    from ordo.sequencer.sequencer import SequencerConfig
    from ordo.broker.topics import Topics, ensure_topics

    namespace = new_namespace(kind)
    ensure_topics(bootstrap, namespace, request_partitions=1)
    produce(bootstrap, namespace, encode_requests(requests))
    sequencer = SequencerThread(
        bootstrap,
        namespace,
        SequencerConfig(max_delay_ms=PREFILL_DELAY_MS, max_txns=batch_size, partitions=partitions, ordering=ordering),
        modules,
    ).start()
    try:
        sequencer.wait_for(len(requests))
    finally:
        sequencer.stop()
    log = Log(namespace, requests, batch_size, sequencer.sequencer.next_batch - 1)
    cursor = LogCursor(namespace=namespace)
    reader = LogReader(bootstrap, Topics(namespace).log, LogCursor(), f"{namespace}.bench-reader")
    deadline = time.monotonic() + 120
    try:
        while cursor.next_batch <= log.last_batch:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{namespace}.log: batch {cursor.next_batch} of {log.last_batch} not read")
            for offset, value in reader.poll_raw(0.05, 10_000):
                log.records.append((offset, value))
                cursor.accept(value, offset)
    finally:
        reader.close()
    return log
