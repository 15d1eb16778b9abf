"""When `ordo run` serves: a request sent from then on is answered without waiting on
anything that came before it, neither a process coming up nor a backlog of the log.

A new sequencer generation writes a start record to `<ns>.log`, which takes its lane over
from the previous one; it lands after every record the log held before the sequencer was
started.
Once every worker's log position has passed the log's end as it stood just before, every
batch of that backlog has been read; the engine serves once every worker has also executed
the newest of them (its outcomes are out). A new data directory, or one far behind, says
first how many batches it is catching up on. Until then requests are kept, not lost: they
only wait.
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


def read_past(statuses: list[dict], log_end_before_start: int) -> bool:
    """Whether every worker has read past the log's end as it was before the sequencer
    started (and so past the sequencer's start record)."""
    return bool(statuses) and all(s.get("next_offset", 0) > log_end_before_start for s in statuses)


def newest_read(statuses: list[dict]) -> int:
    """The newest batch any worker has read, executed or not."""
    return max(s["read_batch"] for s in statuses)


class Readiness:
    """Watches the coordinator's polled statuses and says once, on `stream`, when the engine
    serves (after how many batches of backlog it catches up on first, if any); `since` is the
    seconds from `ordo run`'s start to that moment."""

    def __init__(self, log_end_before_start: int | None, started: float, stream, ask_log_end=None):
        """`log_end_before_start` None: not known yet (the broker did not answer at the
        start); `ask_log_end()` is asked for it at each check until it answers. The end
        taken later lies further on, which only puts off the moment the engine says it
        serves, never brings it forward."""
        self.log_end_before_start = log_end_before_start
        self.started = started
        self.stream = stream
        self.since: float | None = None
        self.backlog_end: int | None = None  # the newest batch read by the time the start record was
        self._ask_log_end = ask_log_end

    def check(self, statuses: list[dict]) -> None:
        if self.since is not None:
            return
        if self.log_end_before_start is None:
            try:
                self.log_end_before_start = self._ask_log_end()
            except Exception:  # the broker between leaders or away: asked again at the next check
                return
        if not read_past(statuses, self.log_end_before_start):
            return
        executed = min(s["executed"] for s in statuses)
        if self.backlog_end is None:
            self.backlog_end = newest_read(statuses)
            if self.backlog_end > executed:
                print(
                    f"ordo catching up: {self.backlog_end - executed:,} batch(es) of the log's backlog are "
                    f"executed first (up to batch {self.backlog_end}); requests sent now are answered after "
                    f"them",
                    file=self.stream,
                    flush=True,
                )
        if executed >= self.backlog_end:
            self.since = time.monotonic() - self.started
            print(
                f"ordo serving: requests are sequenced and executed from now on ({self.since:.1f} s after start)",
                file=self.stream,
                flush=True,
            )
