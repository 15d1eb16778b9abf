"""Prometheus metrics of a running engine (`--metrics-port`), served on 127.0.0.1.

Workers may run as Ray actors in other processes: nothing is served from them. Every
figure comes from the statuses the coordinator already polls (scheduler/follower.py),
read when Prometheus scrapes, so a scrape costs the workers nothing.
"""

from __future__ import annotations

import time
from typing import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import start_http_server

from ordo.scheduler.follower import BATCH_LATENCY_BUCKETS
from ordo.scheduler.liveness import SILENT_AFTER

# A request's outcome is one of these, once: the series add up to the requests decided.
STATUSES = ("committed", "aborted", "rejected")
LAG_EVERY = 1.0  # seconds between broker queries for the lags, however often one scrapes


class RequestsLag:
    """Requests produced to <ns>.requests, and records to the source topics `sources`,
    that the sequencer has not yet put into the log (broker/lag.py), with one consumer
    kept for the engine's life."""

    def __init__(self, bootstrap: str, namespace: str, sources: tuple[str, ...] = ()):
        from confluent_kafka import Consumer

        from ordo.broker.clients import kafka_config
        from ordo.broker.lag import sequencer_group

        self.namespace = namespace
        self.sources = sources
        self.group = sequencer_group(namespace)
        self._consumer = Consumer(kafka_config(bootstrap, {"group.id": self.group, "enable.auto.commit": False}))

    def __call__(self) -> int | None:
        from ordo.broker.lag import requests_lag

        return requests_lag(self._consumer, self.namespace, self.group, sources=self.sources)

    def close(self) -> None:
        self._consumer.close()


class Lags:
    """The log lag and the requests-topic lag, refreshed from the engine's own loop at most
    every LAG_EVERY seconds (the broker is asked there, not on each scrape or line)."""

    def __init__(self, coordinator, requests_lag: Callable[[], int | None] | None = None):
        self.coordinator = coordinator
        self.requests_lag = requests_lag
        self.log: int | None = None
        self.requests: int | None = None
        self._taken = 0.0

    def refresh(self) -> None:
        if time.monotonic() - self._taken < LAG_EVERY:
            return
        self._taken = time.monotonic()
        try:
            value = self.coordinator.log_lag()
            self.log = value if isinstance(value, int) else None
        except Exception:
            self.log = None
        self.requests = self.requests_lag() if self.requests_lag is not None else None


class EngineCollector:
    """The Prometheus view of a coordinator's polled statuses, plus the lags."""

    def __init__(
        self,
        coordinator,
        lags: Lags | None = None,
        sequencer_restarts: Callable[[], int] | None = None,
        readiness=None,
        silences: Callable[[], list] | None = None,
    ):
        self.coordinator = coordinator
        self.lags = lags
        self.sequencer_restarts = sequencer_restarts
        self.readiness = readiness
        self.silences = silences or coordinator.silences  # scheduler/liveness.py

    def collect(self):
        statuses = list(self.coordinator.statuses)
        stats = self.coordinator.stats
        if self.readiness is not None:
            yield _gauge(
                "ordo_serving",
                "1 once the sequencer sequences and every partition worker has read the "
                "log up to its start and executed the backlog before it "
                "(ordo/readiness.py), else 0",
                float(self.readiness.since is not None),
            )
        yield _gauge("ordo_last_applied_batch", "the newest batch applied on every partition", stats.last_batch)
        yield _counter("ordo_batches", "batches applied on every partition since this engine started", stats.batches)
        txns = CounterMetricFamily(
            "ordo_transactions", "requests decided, by outcome (each request once)", labels=["status"]
        )
        by_partition = CounterMetricFamily(
            "ordo_partition_transactions",
            "transaction outcomes reported by each partition",
            labels=["partition", "status"],
        )
        busy = CounterMetricFamily(
            "ordo_worker_busy_seconds", "time each partition worker spent executing batches", labels=["partition"]
        )
        for status in STATUSES:
            txns.add_metric([status], sum(s.get(status, 0) for s in statuses))
            for s in statuses:
                by_partition.add_metric([str(s["partition"]), status], s.get(status, 0))
        for s in statuses:
            busy.add_metric([str(s["partition"])], s.get("busy_s", 0.0))
        yield txns
        yield _counter(
            "ordo_restarts",
            "dependent transactions re-sequenced because a value their keys depend on "
            "changed (a step towards an outcome, not one; docs/ollp.md)",
            sum(s.get("restarted", 0) for s in statuses),
        )
        yield _counter(
            "ordo_reconnaissance_passes",
            "requests re-sequenced after their first pass, which is "
            "not a restart: a dependent transaction's reconnaissance, "
            "or the first turn of a procedure without ANALYZE",
            sum(s.get("reconnoitred", 0) for s in statuses),
        )
        yield by_partition
        yield busy
        yield _histogram(statuses)
        yield _memory(statuses)
        yield _counter("ordo_checkpoints", "checkpoints listed since this engine started", stats.checkpoints)
        yield _counter(
            "ordo_log_records_passed_over",
            "log records the engine read since it started and passed "
            "over: not signed with the log secret, or named by "
            "`ordo log skip`",
            stats.dropped_records,
        )
        log_lag, requests_lag = (self.lags.log, self.lags.requests) if self.lags is not None else (None, None)
        if log_lag is not None:
            yield _gauge("ordo_log_lag_records", "log records not yet read by the slowest partition worker", log_lag)
        if requests_lag is not None:
            yield _gauge("ordo_requests_lag_messages", "requests not yet sequenced into the log", requests_lag)
        unanswered = GaugeMetricFamily(
            "ordo_unanswered_seconds",
            f"how long a partition worker or sequencer process has not answered (listed from {SILENT_AFTER:g} s on)",
            labels=["process", "pid"],
        )
        for silence in self.silences():
            unanswered.add_metric([silence.name, str(silence.pid)], silence.seconds)
        yield unanswered
        if self.sequencer_restarts is not None:
            yield _counter(
                "ordo_sequencer_restarts", "times the engine restarted its sequencer process", self.sequencer_restarts()
            )


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


def _counter(name: str, text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, text, value=value)


def _memory(statuses: list[dict]) -> GaugeMetricFamily:
    memory = GaugeMetricFamily(
        "ordo_partition_memory_bytes",
        "each partition worker's process resident set (resident) and its shard's "
        "RocksDB block cache, memtables and table readers",
        labels=["partition", "kind"],
    )
    for s in statuses:
        for kind, value in s.get("memory", {}).items():
            memory.add_metric([str(s["partition"]), kind], value)
    return memory


def _histogram(statuses: list[dict]) -> HistogramMetricFamily:
    counts = [0] * (len(BATCH_LATENCY_BUCKETS) + 1)
    total = 0.0
    for s in statuses:
        for i, n in enumerate(s.get("latency_counts", ())):
            counts[i] += n
        total += s.get("latency_sum", 0.0)
    buckets, running = [], 0
    for bound, n in zip([*map(str, BATCH_LATENCY_BUCKETS), "+Inf"], counts):
        running += n
        buckets.append((bound, running))
    histogram = HistogramMetricFamily(
        "ordo_batch_latency_seconds",
        "from the sequencer cutting a batch to a partition having executed it "
        "(one observation per batch and partition)",
    )
    histogram.add_metric([], buckets, total)
    return histogram


class MetricsServer:
    def __init__(self, port: int, collector: EngineCollector):
        self.registry = CollectorRegistry()
        self.registry.register(collector)
        try:
            self._server, self._thread = start_http_server(port, addr="127.0.0.1", registry=self.registry)
        except OSError as exc:
            raise RuntimeError(f"cannot serve metrics on 127.0.0.1:{port}: {exc.strerror or exc}") from None
        self.port = self._server.server_address[1]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def engine_observer(
    coordinator,
    bootstrap: str,
    namespace: str,
    quiet: bool,
    metrics_port: int | None,
    sequencer=None,
    stream=None,
    readiness=None,
    sources: tuple[str, ...] = (),
) -> tuple[Callable | None, Callable[[], None]]:
    """The engine loop's progress hook (the progress line, the lags, the metrics endpoint
    on `metrics_port`) and what closes them. `sources`: the app's source topics, whose
    unread records the requests lag counts too."""
    import sys

    from ordo.progress import Progress

    if quiet and metrics_port is None:
        return None, lambda: None
    requests_lag = RequestsLag(bootstrap, namespace, sources)
    lags = Lags(coordinator, requests_lag)
    silences = (
        (lambda: coordinator.silences() + sequencer.silences()) if sequencer is not None else coordinator.silences
    )
    server = None
    if metrics_port is not None:
        restarts = (lambda: sequencer.restarts) if sequencer is not None else None
        server = MetricsServer(metrics_port, EngineCollector(coordinator, lags, restarts, readiness, silences))
        print(f"metrics on http://127.0.0.1:{server.port}/metrics", file=stream or sys.stderr, flush=True)
    line = None if quiet else Progress(coordinator, stream or sys.stderr, lags=lags, silences=silences)

    def progress(stats) -> None:
        lags.refresh()
        if line is not None:
            line(stats)

    def close() -> None:
        if server is not None:
            server.close()
        requests_lag.close()

    return progress, close
