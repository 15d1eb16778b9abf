"""The benchmark client: a process of its own producing requests and timing their outcomes."""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[rank]


def client_main(
    bootstrap: str, namespace: str, warmup: list, burst: list, paced: list, phases: list[tuple[str, float, float]], out
) -> None:
    """A client of its own (own process, own GIL): produce, and read <ns>.results to see
    when each outcome arrives. Phases: warm-up (until the pipeline answers), burst (every
    request as fast as possible: end-to-end throughput), then for each (name, load,
    seconds) of `phases` a rate-limited producer at load × that throughput, whose
    produce → outcome times give the latency. Puts a dict of figures on `out`."""
    try:
        out.put(_client(bootstrap, namespace, warmup, burst, paced, phases))
    except BaseException as exc:  # reported, not lost with the process
        out.put({"error": f"{type(exc).__name__}: {exc}"})


def _client(
    bootstrap: str, namespace: str, warmup: list, burst: list, paced: list, phases: list[tuple[str, float, float]]
) -> dict:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    from ordo.broker.clients import kafka_config
    from ordo.broker.topics import Topics, partition_count

    topics = Topics(namespace)
    producer = Producer(
        kafka_config(bootstrap, {"enable.idempotence": True, "linger.ms": 1, "queue.buffering.max.messages": 1_000_000})
    )
    consumer = Consumer(
        kafka_config(
            bootstrap,
            {
                "group.id": f"bench-client-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "fetch.wait.max.ms": 2,
            },
        )
    )
    consumer.assign(
        [TopicPartition(topics.results, p, OFFSET_BEGINNING) for p in range(partition_count(bootstrap, topics.results))]
    )
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

        figures = {"warmup_s": warmup_s, "end_to_end_tps": throughput, "burst_s": burst_s, "burst_requests": len(burst)}
        remaining = list(paced)
        for name, load, seconds in phases:
            rate = load * throughput
            count = max(50, int(rate * seconds))
            if count > len(remaining):
                raise ValueError(
                    f"the {name} phase needs {count:,} paced requests at {rate:,.0f}/s and "
                    f"{len(remaining):,} are left: raise PACED_MAX_RATE (ordo/benchmarks/defaults.py)"
                )
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
            figures[name] = {
                "p50": percentile(latencies, 50),
                "p99": percentile(latencies, 99),
                "max": max(latencies),
                "mean": statistics.fmean(latencies),
                "load": load,
                "rate_rps": rate,
                "requests": len(chosen),
            }
        figures["statuses"] = statuses
        return figures
    finally:
        stop.set()
        reader.join(5)
        consumer.close()
