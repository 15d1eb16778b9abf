"""The engine's status line: once a second while there is work, the batch executed on every
partition with the outcomes through it, the rate, the log and requests lags, and the
processes that do not answer; none while the engine is idle."""

from __future__ import annotations

import sys
import time

from typing import Callable

from ordo.scheduler.coordinator import Coordinator, EngineStats
from ordo.scheduler.liveness import Silence


class Progress:
    """A status line a second while there is work: the batch executed on every partition
    with the outcomes through it, throughput, log lag and requests not yet sequenced; none
    while the engine is idle."""

    def __init__(
        self,
        coordinator: Coordinator,
        stream=sys.stderr,
        every: float = 1.0,
        lags=None,
        silences: Callable[[], list[Silence]] | None = None,
    ):
        self._coordinator = coordinator
        self._stream = stream
        self._every = every
        self._lags = lags  # ordo.metrics.Lags, refreshed by the caller
        self._silences = silences or coordinator.silences  # processes that do not answer
        self._last = time.monotonic()
        self._last_txns = 0
        self._shown_waiting = False  # the last line showed requests or log records waiting

    def __call__(self, stats: EngineStats) -> None:
        now = time.monotonic()
        if now - self._last < self._every:
            return
        rate = (stats.txns - self._last_txns) / (now - self._last)
        if self._lags is not None:
            log_lag, requests_lag = self._lags.log, self._lags.requests
        else:
            log_lag, requests_lag = self._coordinator.log_lag(), None
        self._last, moved, self._last_txns = now, stats.txns != self._last_txns, stats.txns
        silences = self._silences()
        if not moved and not requests_lag and not self._shown_waiting and not silences:
            # Idle: nothing new to say. Once more after anything was shown waiting (a batch
            # cut after the last outcomes were counted, a sequencer's start record and
            # snapshot), so that the line left on screen does not say it still waits.
            return
        self._shown_waiting = bool(requests_lag) or bool(log_lag)
        unknown = lambda value: "?" if value is None else value  # noqa: E731
        print(
            f"batch {stats.executed_batch} | {stats.txns} txns ({rate:,.0f}/s) | committed {stats.committed} "
            f"aborted {stats.aborted} rejected {stats.rejected} | log lag {unknown(log_lag)}"
            + ("" if self._lags is None else f" | requests lag {unknown(requests_lag)}")
            + (f" | passed over {stats.dropped_records} log records" if stats.dropped_records else "")
            + "".join(f" | {silence}" for silence in silences),
            file=self._stream,
            flush=True,
        )
