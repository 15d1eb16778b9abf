"""Everything on one machine: the local broker, the topics, a sequencer and an engine,
used by `ordo demo`, `ordo bench` and the tests."""

from __future__ import annotations

import threading
import time

from ordo.log.records import Batch, LogCursor
from ordo.log.reader import LogReader
from ordo.sequencer.sequencer import Sequencer, SequencerConfig
from ordo.broker.topics import Topics


class SequencerThread:
    """A sequencer on a thread of this process, for tools that sequence a known set of
    requests and stop."""

    def __init__(
        self,
        bootstrap: str,
        namespace: str,
        config: SequencerConfig = SequencerConfig(),
        procedure_modules: tuple[str, ...] = (),
    ):
        from ordo.procedures.loading import load_registry

        self.sequencer = Sequencer(bootstrap, namespace, load_registry(procedure_modules), config)
        self._thread = threading.Thread(target=self.sequencer.run, daemon=True)

    def start(self) -> "SequencerThread":
        self.sequencer.start()
        self._thread.start()
        return self

    def wait_for(self, requests: int, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while self.sequencer.stats.sequenced < requests:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise TimeoutError(f"sequenced {self.sequencer.stats.sequenced} of {requests} requests")
            time.sleep(0.01)

    def stop(self) -> None:
        self.sequencer.stop()
        self._thread.join(30)


def read_log(bootstrap: str, namespace: str, until_batch: int, timeout: float = 60.0) -> list[Batch]:
    """The accepted batches 1..until_batch of a namespace's log."""
    reader = LogReader(bootstrap, Topics(namespace).log, LogCursor(), f"{namespace}.log-reader")
    batches: list[Batch] = []
    deadline = time.monotonic() + timeout
    try:
        while (not batches or batches[-1].batch_id < until_batch) and time.monotonic() < deadline:
            batches.extend(batch for batch, _ in reader.poll(0.1, 1000))
    finally:
        reader.close()
    if not batches or batches[-1].batch_id < until_batch:
        raise TimeoutError(f"log holds {len(batches)} batches, expected {until_batch}")
    return [batch for batch in batches if batch.batch_id <= until_batch]
