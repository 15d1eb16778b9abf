"""Progress lines of the border jobs on stderr, every few seconds while they work.

A daemon thread asks Spark (its status tracker, and a streaming query's progress) how far
a job has got and prints one line: what has been read and written so far, and the Spark
stage running now with its tasks done. While nothing moves (a stream waiting for data) it
prints once a minute.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, TextIO


def running_stages(spark) -> str:
    """`stage 12: 3/8 tasks` for each stage running now ('' when none)."""
    try:
        tracker = spark.sparkContext.statusTracker()
        parts = []
        for stage_id in sorted(tracker.getActiveStageIds()):
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                parts.append(f"stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks")
        return ", ".join(parts)
    except Exception:  # the session is stopping: no progress to tell
        return ""


class StreamCounter:
    """Rows read and micro-batches run by a streaming query, from its progress updates
    (each counted once, however often it is polled; an idle update, which carries the next
    micro-batch's id, counts no batch)."""

    def __init__(self):
        self.rows = 0
        self._updates: set[tuple] = set()
        self._batches: set[int] = set()
        self._lock = threading.Lock()

    @property
    def batches(self) -> int:
        return len(self._batches)

    def update(self, query) -> None:
        try:
            updates = query.recentProgress
        except Exception:
            return
        with self._lock:
            for update in updates:
                key = (update.get("batchId"), update.get("timestamp"))
                if key in self._updates:
                    continue
                self._updates.add(key)
                self.rows += int(update.get("numInputRows") or 0)
                if "addBatch" in (update.get("durationMs") or {}):
                    self._batches.add(update.get("batchId"))


class Progress:
    """`with Progress(spark, "ordo-produce", lambda: "..."):` prints a line every `interval`
    seconds (0: never) while something is running or `describe()` changed."""

    def __init__(
        self,
        spark,
        label: str,
        describe: Callable[[], str],
        interval: float = 5.0,
        out: TextIO | None = None,
        idle_every: float = 60.0,
    ):
        self.spark, self.label, self.describe = spark, label, describe
        self.interval, self.idle_every = interval, idle_every
        self.out = out or sys.stderr
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lines = 0

    def __enter__(self) -> Progress:
        if self.interval and self.interval > 0:
            self._thread = threading.Thread(target=self._run, name=f"{self.label}-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        started = time.monotonic()
        last_text, last_print = None, started
        while not self._stop.wait(self.interval):
            try:
                text = self.describe()
            except Exception:
                continue
            stages = running_stages(self.spark)
            now = time.monotonic()
            if stages or text != last_text or now - last_print >= self.idle_every:
                line = f"{self.label}: {now - started:.0f}s, {text}" + (f"; running {stages}" if stages else "")
                try:
                    print(line, file=self.out, flush=True)
                except ValueError:  # the stream was closed under us
                    return
                self.lines += 1
                last_text, last_print = text, now
