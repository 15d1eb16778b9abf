"""`ordo bench latency`: open-loop latency at fixed request rates, and where it goes.

For each rate R, a fresh namespace gets its own sequencer (child process) and engine (this
process; Ray workers with `--runtime ray`), and a client process of its own sends requests
on the schedule t0 + i/R whatever happens to them: an open loop. Each request's latency runs
from its *scheduled* send time to its outcome's arrival at the client, so a pipeline that
stalls cannot slow the client down and hide the queue it builds (no coordinated omission).
Before the clock starts, a warm-up waits until the engine answers; before the first rate,
unreported rounds of BROKER_WARMUP_S seconds warm the broker's JVM until its JIT compiler
is done (it took a third of a core for about 45 s of traffic on a 2-vCPU machine), for
BROKER_WARMUP_MAX_S at most.

Where the time goes comes from the records' own Kafka timestamps (CreateTime, set by each
producer as it takes a record) and from two moments the client notes itself: when the broker
acknowledged each request, and when each log record became readable to a log reader (the
client follows <ns>.log as the partition workers do, read_committed). Everything runs on
one machine, so on one clock:

    send        scheduled time → request record's CreateTime  (the client falling behind)
    request     → the broker's acknowledgement of the request  (the producer's linger + its produce)
    sequencing  → the log record of its batch                  (the sequencer's fetch + the epoch's cut)
    commit      → the batch readable in the log                (the sequencer's append + a reader's fetch)
    execution   → the result record                            (the partition's execution + its outputs)
    delivery    → arrival at the client                        (the outputs' acknowledgement + the outcome's fetch)

The hops add up to the latency, so their shares (each hop's total over the latencies'
total) add up to 100 %. Kafka timestamps are whole milliseconds (truncated), so a hop's
figures are good to about a millisecond: a send that keeps its schedule reads about -0.5 ms,
and a hop that straddles a truncated stamp can read slightly negative. The client's log
follower stands in for the partition workers, which may get a batch a little sooner on a
busy machine: execution (from the follower's read) then reads short and commit long.

As Styx's harness counts it, only requests scheduled after the first TIMED_AFTER of a
rate's run are timed: the pipeline's first batches at a new rate do not count.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from typing import Any, Callable

from ordo.benchmarks.defaults import WARMUP_SEED
from ordo.benchmarks.load_client import percentile
from ordo.benchmarks.machine import finish_report, machine
from ordo.benchmarks.report import cell
from ordo.benchmarks.requests import encode_requests, ordering_of, workload_requests
from ordo.benchmarks.runners import sequencer_config

HOPS = ("send", "request", "sequencing", "commit", "execution", "delivery")
TIMED_AFTER = 0.2  # the share of each run, from its start, that is not timed
WARMUP_REQUESTS = 20
BROKER_WARMUP_S = 15.0
# The broker is warm once its JIT compiler took under this share of a core during a warm-up
# round; BROKER_WARMUP_MAX_S of rounds at most (a broker whose compiler threads cannot be
# read gets one round).
BROKER_JIT_QUIET = 0.05
BROKER_WARMUP_MAX_S = 90.0


def cadence(config) -> str:
    """The sequencer's epochs as a run's heading names them (`config`: a SequencerConfig)."""
    epochs = config.epoch_length()
    if not config.epoch_ms:
        return ", sequencer group commit"
    if epochs.fixed:
        return f", sequencer epochs of {config.epoch_ms:g} ms"
    return (
        f", sequencer epochs of {epochs.shortest * 1000:g}–{epochs.longest * 1000:g} ms following the rate "
        f"(the longest from {epochs.full_rate:,.0f} req/s)"
    )


# -- the client (a process of its own) -----------------------------------------------


# The client wakes at most once a millisecond and sends every request due by then. Woken
# for each request, at 10,000 requests/s it took a third of a core from the two the engine,
# the sequencer and the broker share, and every hop's tail grew with it (docs/benchmarks.md).
TICK_S = 0.001


def open_loop(
    send: Callable[[int], None],
    rate: float,
    count: int,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    tick: float = TICK_S,
) -> list[float]:
    """Call send(i) for i in 0..count-1 at t0 + i/rate, never before, never waiting on
    anything but the schedule (a late send goes at once, and the ones after keep their own
    times), sleeping at least `tick` at a time: a request may go up to a tick after its time,
    and its latency counts from its time. The scheduled times, in `clock`'s seconds."""
    t0 = clock()
    scheduled = [t0 + i / rate for i in range(count)]
    for i, due in enumerate(scheduled):
        delay = due - clock()
        if delay > 0:
            sleep(max(delay, tick))
        send(i)
    return scheduled


def latency_client_main(
    bootstrap: str, namespace: str, warmup: list, requests: list, rate: float, drain_s: float, out
) -> None:
    try:
        out.put(_client(bootstrap, namespace, warmup, requests, rate, drain_s))
    except BaseException as exc:  # reported, not lost with the process
        out.put({"error": f"{type(exc).__name__}: {exc}"})


def _client(bootstrap: str, namespace: str, warmup: list, requests: list, rate: float, drain_s: float) -> dict:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    from ordo.broker.clients import consumer_config, kafka_config
    from ordo.broker.topics import Topics, partition_count

    topics = Topics(namespace)
    # Not idempotent: librdkafka's idempotent producer counts messages in flight against its
    # five requests per partition, so while one request of five or more waits for its answer
    # its broker thread wakes without pause (about 750,000 times a second here), and took half
    # a core of the two the pipeline under test shares (docs/benchmarks.md). No broker fault
    # happens in this benchmark to make a retry send a request twice.
    producer = Producer(
        kafka_config(
            bootstrap,
            {
                "enable.idempotence": False,
                "acks": "all",
                "max.in.flight.requests.per.connection": 5,
                "linger.ms": 1,
                "queue.buffering.max.messages": 1_000_000,
            },
        )
    )
    consumer = Consumer(
        consumer_config(bootstrap, {"group.id": f"bench-latency-{uuid.uuid4().hex}", "enable.auto.commit": False})
    )
    consumer.assign(
        [TopicPartition(topics.results, p, OFFSET_BEGINNING) for p in range(partition_count(bootstrap, topics.results))]
    )
    # The log as the partition workers read it: what a batch's commit makes readable.
    log_follower = Consumer(
        consumer_config(
            bootstrap,
            {
                "group.id": f"bench-latency-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            },
        )
    )
    log_follower.assign([TopicPartition(topics.log, 0, OFFSET_BEGINNING)])
    outcomes: dict[str, tuple[float, int, int, str]] = {}  # id -> (arrival s, result CreateTime ms, type, status)
    acknowledged: dict[str, float] = {}  # request id -> when the broker acknowledged it (s)
    readable: dict[int, float] = {}  # log offset -> when it became readable (s)
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            first = consumer.poll(0.05)
            if first is None:
                continue
            now = time.time()
            for message in [first, *consumer.consume(10_000, 0)]:
                if message.error() is None:
                    key = message.key().decode()
                    if key not in outcomes:
                        kind, stamp = message.timestamp()
                        outcomes[key] = (now, stamp, kind, json.loads(message.value())["status"])

    def follow_log() -> None:
        while not stop.is_set():
            first = log_follower.poll(0.05)
            if first is None:
                continue
            now = time.time()
            for message in [first, *log_follower.consume(10_000, 0)]:
                if message.error() is None:
                    readable.setdefault(message.offset(), now)

    def acked(error, message) -> None:
        if error is None:
            acknowledged.setdefault(message.key().decode(), time.time())

    def serve_acknowledgements() -> None:
        # In a thread of its own, so an acknowledgement is noted when it comes, not at the next send.
        while not stop.is_set():
            producer.poll(0.005)

    def send(key: str, value: bytes) -> None:
        while True:
            try:
                producer.produce(topics.requests, key=key.encode(), value=value, on_delivery=acked)
                return
            except BufferError:
                time.sleep(0.01)

    def wait_for(ids: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(i not in outcomes for i in ids) and time.monotonic() < deadline:
            time.sleep(0.01)

    threads = [threading.Thread(target=target, daemon=True) for target in (read, follow_log, serve_acknowledgements)]
    for thread in threads:
        thread.start()
    try:
        started = time.monotonic()
        for key, value in warmup:
            send(key, value)
        producer.flush(30)
        wait_for([k for k, _ in warmup], 120)
        if any(k not in outcomes for k, _ in warmup):
            raise TimeoutError("the engine did not answer the warm-up requests within 120 s")
        warmup_s = time.monotonic() - started
        scheduled = open_loop(lambda i: send(*requests[i]), rate, len(requests))
        producer.flush(60)
        wait_for([k for k, _ in requests], drain_s)
        time.sleep(0.2)  # the log follower's last fetch
        return {
            "warmup_s": warmup_s,
            "scheduled": [(key, due) for (key, _), due in zip(requests, scheduled)],
            "outcomes": {key: outcomes[key] for key, _ in requests if key in outcomes},
            "acknowledged": {key: acknowledged[key] for key, _ in requests if key in acknowledged},
            "readable": dict(readable),
        }
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        consumer.close()
        log_follower.close()


# -- the records' timestamps -----------------------------------------------------------


def request_times(bootstrap: str, namespace: str, ids: set[str], timeout: float = 60.0) -> dict[str, int]:
    """CreateTime (ms) of each request record of `ids` on <ns>.requests."""
    from ordo.broker.topics import Topics, partition_count

    topic = Topics(namespace).requests
    found: dict[str, int] = {}

    def take(message) -> None:
        key = message.key().decode()
        if key in ids:
            found.setdefault(key, message.timestamp()[1])

    _read_all(bootstrap, topic, partition_count(bootstrap, topic), take, lambda: len(found) >= len(ids), timeout)
    return found


def log_times(bootstrap: str, namespace: str, ids: set[str], timeout: float = 60.0) -> dict[str, tuple[int, int]]:
    """(CreateTime ms, offset) of the <ns>.log record holding the accepted batch of each request of `ids`."""
    from ordo.log.records import LogCursor
    from ordo.broker.topics import Topics

    cursor = LogCursor(namespace=namespace)
    found: dict[str, tuple[int, int]] = {}

    def take(message) -> None:
        batch = cursor.accept(message.value(), message.offset())
        if batch is not None:
            record = (message.timestamp()[1], message.offset())
            for entry in batch.entries:
                if entry[0] in ids:
                    found.setdefault(entry[0], record)

    _read_all(bootstrap, Topics(namespace).log, 1, take, lambda: len(found) >= len(ids), timeout)
    return found


def _read_all(bootstrap: str, topic: str, partitions: int, take, done: Callable[[], bool], timeout: float) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from ordo.broker.clients import consumer_config

    consumer = Consumer(
        consumer_config(
            bootstrap,
            {
                "group.id": f"bench-latency-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            },
        )
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    deadline = time.monotonic() + timeout
    try:
        while not done() and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 0.2):
                if message.error() is None:
                    take(message)
    finally:
        consumer.close()


# -- the figures (pure) ------------------------------------------------------------------


def hop_times(
    scheduled_s: float,
    request_ms: int,
    acknowledged_s: float,
    log_ms: int,
    readable_s: float,
    result_ms: int,
    arrival_s: float,
) -> dict[str, float]:
    """One request's latency and its hops, in ms; the hops add up to the latency."""
    return {
        "latency": (arrival_s - scheduled_s) * 1000,
        "send": request_ms - scheduled_s * 1000,
        "request": acknowledged_s * 1000 - request_ms,
        "sequencing": log_ms - acknowledged_s * 1000,
        "commit": (readable_s * 1000) - log_ms,
        "execution": result_ms - readable_s * 1000,
        "delivery": arrival_s * 1000 - result_ms,
    }


def summarize(
    rate: float,
    seconds: float,
    scheduled: list[tuple[str, float]],
    outcomes: dict,
    requested: dict[str, int],
    acknowledged: dict[str, float],
    logged: dict[str, tuple[int, int]],
    readable: dict[int, float],
) -> dict[str, Any]:
    """The figures of one rate. `scheduled`: (id, scheduled send time s), in schedule order;
    `outcomes`: id -> (arrival s, result CreateTime ms, timestamp type, status); `requested`:
    id -> CreateTime ms of its request record; `acknowledged`: id -> when the broker
    acknowledged it (s); `logged`: id -> (CreateTime ms, offset) of its batch's log record;
    `readable`: log offset -> when a log reader got it (s). Requests scheduled in the first
    TIMED_AFTER of the run are not timed. Achieved throughput: outcomes over the time from
    the first scheduled send to the last arrival."""
    untimed = int(len(scheduled) * TIMED_AFTER)
    early = [outcomes[key][0] - due for key, due in scheduled[:untimed] if key in outcomes]
    rows = []
    for key, due in scheduled[untimed:]:
        if key in outcomes and key in requested and key in acknowledged and key in logged:
            log_ms, offset = logged[key]
            if offset in readable:
                rows.append(
                    hop_times(
                        due,
                        requested[key],
                        acknowledged[key],
                        log_ms,
                        readable[offset],
                        outcomes[key][1],
                        outcomes[key][0],
                    )
                )
    latencies = [row["latency"] for row in rows]
    p99 = percentile(latencies, 99)
    total = sum(latencies)
    statuses: dict[str, int] = {}
    for outcome in outcomes.values():
        statuses[outcome[3]] = statuses.get(outcome[3], 0) + 1
    span = max((o[0] for o in outcomes.values()), default=0.0) - (scheduled[0][1] if scheduled else 0.0)
    result: dict[str, Any] = {
        "rate_rps": rate,
        "seconds": seconds,
        "requests": len(scheduled),
        "answered": len(outcomes),
        "timed": len(rows),
        "timed_after_pct": round(100 * TIMED_AFTER),
        "achieved_rps": round(len(outcomes) / span, 1) if span > 0 else None,
        "statuses": statuses,
        "latency_ms": {
            "p50": round(percentile(latencies, 50), 2),
            "p90": round(percentile(latencies, 90), 2),
            "p99": round(p99, 2),
        },
        "hops": {},
        # the untimed start of the run: a pipeline that falls behind in its first seconds shows here
        "early_latency_ms": {name: round(percentile(early, q) * 1000, 2) for name, q in (("p50", 50), ("p99", 99))},
        "tail": tail_shares(rows, p99),
    }
    result["latency_ms"]["max"] = round(max(latencies), 2) if latencies else None
    result["latency_ms"]["mean"] = round(statistics.fmean(latencies), 2) if latencies else None
    for hop in HOPS:
        values = [row[hop] for row in rows]
        result["hops"][hop] = {
            "share_pct": round(100 * sum(values) / total, 1) if total else None,
            "p50_ms": round(percentile(values, 50), 2),
            "p99_ms": round(percentile(values, 99), 2),
        }
    return result


def tail_shares(rows: list[dict[str, float]], threshold: float) -> dict[str, Any]:
    """Which hops make the tail: each hop's share of the latency of the requests at or above
    `threshold` (the p99), which a hop's own p99 does not tell (its slowest requests need
    not be the slowest ones end to end)."""
    slow = [row for row in rows if row["latency"] >= threshold]
    total = sum(row["latency"] for row in slow)
    return {
        "requests": len(slow),
        "share_pct": {hop: round(100 * sum(row[hop] for row in slow) / total, 1) if total else None for hop in HOPS},
    }


# -- one rate, end to end ----------------------------------------------------------------


def measure_rate(
    bootstrap: str,
    workload: str,
    knobs: dict,
    rate: float,
    seconds: float,
    scheduler: str,
    partitions: int,
    max_txns: int,
    runtime: str,
    directory: str,
    seed: int,
    max_delay_ms: float | tuple[float, float | None] | None = None,
    round_txns: int | None = None,
    broker_pid: int | None = None,
) -> dict[str, Any]:
    """A fresh namespace, sequencer and engine; the open-loop client at `rate` for `seconds`.
    `round_txns`: the engine's (scheduler/round.py), None for its default. Each process's CPU
    time per request is measured over the client's run (the broker's too, with
    `broker_pid`)."""
    from ordo.benchmarks.runners import CpuWatch, per_request_us, process_roles
    import multiprocessing
    import queue

    from ordo.benchmarks.prefill import new_namespace
    from ordo.services import SequencerProcess
    from ordo.scheduler.coordinator import Coordinator
    from ordo.broker.topics import ensure_topics

    namespace = new_namespace("latency")
    ensure_topics(bootstrap, namespace, request_partitions=1)
    warmup = encode_requests(workload_requests(workload, WARMUP_REQUESTS, WARMUP_SEED, knobs, partitions))
    requests = encode_requests(workload_requests(workload, max(1, round(rate * seconds)), seed, knobs, partitions))
    rounds = {} if round_txns is None else {"round_txns": round_txns}
    coordinator = Coordinator(bootstrap, namespace, directory, scheduler, partitions, runtime=runtime, **rounds)
    sequencer = SequencerProcess(
        bootstrap,
        namespace,
        sequencer_config(max_delay_ms, max_txns=max_txns, partitions=partitions, ordering=ordering_of(scheduler)),
    )
    engine_error: list[BaseException] = []

    def run_engine() -> None:
        try:
            coordinator.run()
        except BaseException as exc:
            engine_error.append(exc)

    engine = threading.Thread(target=run_engine, daemon=True)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    drain_s = 60 + 2 * seconds
    client = context.Process(
        target=latency_client_main, daemon=True, args=(bootstrap, namespace, warmup, requests, rate, drain_s, out)
    )
    try:
        sequencer.start()
        engine.start()
        client.start()
        cpu = CpuWatch(process_roles(coordinator, sequencer.pid, client.pid, broker_pid))
        cpu.start()
        result = None
        deadline = time.monotonic() + 120 + seconds + drain_s + 60
        while result is None:
            try:
                result = out.get(timeout=0.5)
            except queue.Empty:
                if engine_error:
                    raise RuntimeError(f"engine failed: {engine_error[0]!r}") from engine_error[0]
                if not client.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("the latency client ended without a result")
        cpu_s = cpu.stop()
        if "error" in result:
            raise RuntimeError(f"latency client: {result['error']}")
        workers = coordinator.statuses
    finally:
        coordinator.stop()
        if engine.ident is not None:
            engine.join(120)
        else:
            coordinator.close()
        sequencer.stop()
        client.join(10)
        if client.is_alive():
            client.kill()
    answered = set(result["outcomes"])
    figures = summarize(
        rate,
        seconds,
        result["scheduled"],
        result["outcomes"],
        request_times(bootstrap, namespace, answered),
        result["acknowledged"],
        log_times(bootstrap, namespace, answered),
        result["readable"],
    )
    figures["warmup_s"] = round(result["warmup_s"], 2)
    # CPU microseconds per request, by process, over the client's run (its warm-up included)
    figures["cpu_us_per_request"] = per_request_us(cpu_s, len(warmup) + len(requests))
    # Per worker: batches executed, in how many executions (rounds), and seconds busy.
    figures["engine"] = [
        {"batches": w["executed"], "rounds": w.get("rounds"), "busy_s": round(w.get("busy_s", 0.0), 2)} for w in workers
    ]
    kinds = {kind for _, _, kind, _ in result["outcomes"].values()}
    figures["result_timestamps"] = "CreateTime" if kinds == {1} else f"types {sorted(kinds)}"
    return figures


def warm_up_broker(
    broker: Any, say: Callable[[str], None], warm_round: Callable[[str, float], Any], most_s: float
) -> dict[str, Any]:
    """Rounds of traffic (`warm_round(directory, seconds)`), `most_s` seconds of it at most,
    until the broker's JIT compiler is quiet: what it took, to go beside the figures."""
    from ordo.benchmarks.machine import jit_compiler_cpu_s

    pid = broker.pid
    shares: list[float] = []
    spent = 0.0
    while spent < most_s:
        seconds = min(BROKER_WARMUP_S, most_s - spent)
        say(f"  warming up the broker: {seconds:g} s of traffic, not reported")
        before, started = jit_compiler_cpu_s(pid), time.monotonic()
        warm_round(f"warm-up-{len(shares)}", seconds)
        spent += seconds
        after = jit_compiler_cpu_s(pid)
        if before is None or after is None:
            break
        shares.append(round((after - before) / (time.monotonic() - started), 3))
        if shares[-1] < BROKER_JIT_QUIET:
            break
    if shares:
        say(f"  the broker's JIT compiler took {', '.join(f'{share:.0%}' for share in shares)} of a core, by round")
    return {"seconds": spent, "jit_share_by_round": shares}


def run_latency(
    workload: str,
    rates: list[float],
    partitions: int,
    scheduler: str,
    seconds: float,
    seed: int,
    knobs: dict,
    max_txns: int,
    runtime: str = "auto",
    json_path: str | None = None,
    max_delay_ms: float | tuple[float, float | None] | None = None,
    round_txns: int | None = None,
    plot_path: str | None = None,
    beside: list[dict[str, Any]] | None = None,
    broker_warmup_s: float | None = None,
) -> dict[str, Any]:
    """Each rate on a fresh namespace, sequencer and engine; `plot_path`: p50 and p99
    against the rate, with `beside` (earlier reports) in the same picture;
    `broker_warmup_s`: unreported traffic at most first (None: BROKER_WARMUP_MAX_S)."""
    from ordo.benchmarks.runners import shutdown_ray
    from ordo.broker.local import local_broker

    if not rates or any(r <= 0 for r in rates):
        raise ValueError("--rate takes a comma-separated list of request rates > 0, e.g. 500,1000")
    if seconds <= 0:
        raise ValueError("--seconds must be > 0")
    if partitions < 1:
        raise ValueError("--partitions must be >= 1")
    say = lambda text="": print(text, flush=True)  # noqa: E731
    report: dict[str, Any] = {
        "workload": workload,
        "scheduler": scheduler,
        "partitions": partitions,
        "runtime": runtime,
        "seconds": seconds,
        "knobs": knobs,
        "batch_size": max_txns,
        "max_delay_ms": max_delay_ms,
        "round_txns": round_txns,
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "machine": machine(),
        "runs": [],
    }
    say(
        f"ordo bench latency {workload} ({scheduler}, {partitions} partition(s), {runtime} runtime): "
        f"open loop at {', '.join(f'{r:g}' for r in rates)} req/s, {seconds:g} s each, "
        f"{len(os.sched_getaffinity(0))} cores" + cadence(sequencer_config(max_delay_ms, partitions=partitions))
    )
    root = tempfile.mkdtemp(prefix="ordo-latency-")
    try:
        with local_broker() as broker:
            # A broker just started runs its code interpreted until the JVM has compiled it:
            # the first seconds of traffic see several times the latency of the rest, and the
            # compiler's threads take CPU from the pipeline under test. Unreported rounds at
            # the highest rate warm it up as a long-running broker is.
            report["broker_warmup"] = warm_up_broker(
                broker,
                say,
                lambda directory, warm_s: measure_rate(
                    broker.bootstrap_servers,
                    workload,
                    knobs,
                    max(rates),
                    warm_s,
                    scheduler,
                    partitions,
                    max_txns,
                    runtime,
                    os.path.join(root, directory),
                    seed,
                    max_delay_ms,
                    round_txns,
                    broker.pid,
                ),
                BROKER_WARMUP_MAX_S if broker_warmup_s is None else broker_warmup_s,
            )
            for i, rate in enumerate(rates):
                run = measure_rate(
                    broker.bootstrap_servers,
                    workload,
                    knobs,
                    rate,
                    seconds,
                    scheduler,
                    partitions,
                    max_txns,
                    runtime,
                    os.path.join(root, f"rate-{i}"),
                    seed,
                    max_delay_ms,
                    round_txns,
                    broker.pid,
                )
                report["runs"].append(run)
                say(format_run(run))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutdown_ray()
    finish_report(report, json_path)
    say()
    say(format_report(report))
    if plot_path:
        from ordo.benchmarks.sweep_plot import knee, label, plot_sweep

        for each in [*(beside or []), report]:
            bend = knee(each)
            say(f"{label(each)}: " + ("kept up at every rate" if bend is None else f"the knee at {bend:,g} req/s"))
        say(f"plot: {plot_sweep([*(beside or []), report], plot_path)}")
    return report


# -- the table ---------------------------------------------------------------------------


def format_run(run: dict[str, Any]) -> str:
    lat = run["latency_ms"]
    line = (
        f"  {run['rate_rps']:>8,g} req/s: {cell(run['achieved_rps'], ',.0f', 7)} outcomes/s, "
        f"{run['answered']:,}/{run['requests']:,} answered, p50 {cell(lat['p50'], '.1f', 0)} "
        f"p99 {cell(lat['p99'], '.1f', 0)} max {cell(lat['max'], '.1f', 0)} ms"
    )
    early = run.get("early_latency_ms")
    if early:
        line += f" (first {TIMED_AFTER:.0%}: p50 {cell(early['p50'], '.1f', 0)} p99 {cell(early['p99'], '.1f', 0)})"
    if run["answered"] < run["requests"]:
        line += f"  ({run['requests'] - run['answered']:,} NOT ANSWERED)"
    engine = run.get("engine")
    if engine:
        line += "; workers: " + ", ".join(
            f"{w['batches']:,} batches in {w['rounds']:,} rounds, {w['busy_s']:.1f} s busy" for w in engine
        )
    return line


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"{report['workload']} | {report['scheduler']} | {report['partitions']} partition(s) | "
        f"{report['seconds']:g} s per rate | open loop, latency from the scheduled send time",
        f"{'rate':>8} {'achieved':>9} {'answered':>15} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}",
    ]
    for run in report["runs"]:
        lat = run["latency_ms"]
        lines.append(
            f"{run['rate_rps']:>8,g} {cell(run['achieved_rps'], ',.0f', 9)} "
            f"{run['answered']:>7,}/{run['requests']:<7,} {cell(lat['p50'], '.1f', 8)} "
            f"{cell(lat['p90'], '.1f', 8)} {cell(lat['p99'], '.1f', 8)} {cell(lat['max'], '.1f', 8)}"
        )
    lines += [
        "",
        f"where the time goes: share of the latency, median / p99 ms per hop (requests after the "
        f"first {TIMED_AFTER:.0%} of each run)",
        f"{'rate':>8} " + " ".join(f"{hop:>20}" for hop in HOPS),
    ]
    for run in report["runs"]:
        hops = []
        for hop in HOPS:
            h = run["hops"][hop]
            hops.append(
                f"{cell(h['share_pct'], '.0f', 3)} % {cell(h['p50_ms'], '.1f', 5)} / {cell(h['p99_ms'], '.1f', 5)}"
            )
        lines.append(f"{run['rate_rps']:>8,g} " + " ".join(f"{h:>20}" for h in hops))
    lines.append("the slowest 1 % (at or above the p99): each hop's share of their latency")
    for run in report["runs"]:
        shares = run.get("tail", {}).get("share_pct", {})
        lines.append(f"{run['rate_rps']:>8,g} " + " ".join(f"{cell(shares.get(hop), '.0f', 18)} %" for hop in HOPS))
    if any(run.get("cpu_us_per_request") for run in report["runs"]):
        lines.append("CPU µs per request, by process (over each run, its warm-up included)")
        for run in report["runs"]:
            figures = run.get("cpu_us_per_request") or {}
            lines.append(f"{run['rate_rps']:>8,g} " + ", ".join(f"{role} {us:,.1f}" for role, us in figures.items()))
    lines.append(
        "send: schedule → request record; request: → acknowledged by the broker; sequencing: → log "
        "record (epoch or group commit); commit: → readable in the log (the sequencer's append); execution: → "
        "result record; delivery: → client (outputs' acknowledgement + fetch)"
    )
    m = report["machine"]
    lines += [
        "",
        f"machine: {m['cpus']} × {m['cpu_model']}, {m['memory_gb']} GB, Python {m['python']}, "
        f"{m['broker']}; load average {m['load_average']} at start, {m.get('load_average_end')} at end",
    ]
    return "\n".join(lines)
