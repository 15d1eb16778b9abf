"""When `ordo run` serves: the sequencer it started is sequencing, and every partition
worker has read the log up to that sequencer's start record.

A new sequencer generation writes a start record to `<ns>.log` once it has fenced the
previous one; it lands after every record the log held before the sequencer was started.
So the engine serves once every worker's log position has passed the log's end as it
stood just before: a request sent from then on is cut into a batch and executed without
waiting for a process to come up (Ray workers, the sequencer's transactions, the reading
of the log). A backlog read by then may still be executing and applying: a request waits
behind it as behind any other batches. Until then requests are kept, not lost: they only wait.
"""

from __future__ import annotations

import time


def log_end(coordinator, timeout: float = 30.0) -> int:
    """The log's end offset now, asked again while its partition is between leaders."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return coordinator.log_end(timeout=5)
        except Exception:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def serving(statuses: list[dict], log_end_before_start: int) -> bool:
    """Whether every worker has read past the log's end as it was before the sequencer
    started (and so past the sequencer's start record)."""
    return bool(statuses) and all(s.get("next_offset", 0) > log_end_before_start for s in statuses)


class Readiness:
    """Watches the coordinator's polled statuses and says once, on `stream`, when the engine
    serves; `since` is the seconds from `ordo run`'s start to that moment."""

    def __init__(self, log_end_before_start: int, started: float, stream):
        self.log_end_before_start = log_end_before_start
        self.started = started
        self.stream = stream
        self.since: float | None = None

    def check(self, statuses: list[dict]) -> None:
        if self.since is None and serving(statuses, self.log_end_before_start):
            self.since = time.monotonic() - self.started
            print(f"ordo serving: requests are sequenced and executed from now on "
                  f"({self.since:.1f} s after start)", file=self.stream, flush=True)
