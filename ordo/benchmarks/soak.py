"""A soak: `ordo run` in its own process under a steady open-loop rate, long enough to tell
warm-up from a leak. Every interval it samples the resident memory of each process (the
engine, its sequencer, Ray workers, the broker) and, from the engine's metrics, what RocksDB
holds (block cache, memtables, table readers) and how many requests were answered.

Warm-up is memory that stops growing (caches filling to their capacity, buffers reaching
their size); a leak keeps growing with the requests. The report gives, per process, the
growth per 100,000 requests over the first and the second half of the run: a plateau has a
second half near zero.

With `bounce_every`, the broker is bounced under the load every so many seconds (its node
stopped, SIGTERM and SIGKILL in turn, and started again on its data after `down` seconds),
and the report says, for each bounce, how long the engine took to answer again; at the end
every request must have exactly one outcome and the engine's state must equal a serial
reading of the log."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, Callable

from ordo.benchmarks.latency import open_loop
from ordo.benchmarks.machine import finish_report, machine
from ordo.benchmarks.requests import encode_requests, workload_requests

CHUNK = 10_000  # requests generated at a time, so a long soak never holds them all
DRAIN_S = 300.0  # how long the last requests may take to be answered
# How long a bounced broker may take to serve again: on a machine under heavy load a KRaft
# node has taken more than 90 s.
RESTART_WAIT_S = 600.0
_METRICS_LINE = re.compile(r"metrics on (http://127\.0\.0\.1:\d+/metrics)")
_SAMPLE = re.compile(r"^(ordo_\w+?)(?:\{([^}]*)\})? ([0-9.eE+-]+)$")


def parse_metrics(text: str) -> dict[tuple[str, tuple], float]:
    """Ordo's samples in Prometheus' text format -> {(name, ((label, value), …)): value}."""
    samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            name, labels, value = match.groups()
            pairs = [part.split("=", 1) for part in labels.split(",")] if labels else []
            samples[(name, tuple((k, v.strip('"')) for k, v in pairs))] = float(value)
    return samples


def answered(samples: dict) -> int:
    """Requests with an outcome."""
    return int(sum(v for (name, _), v in samples.items() if name == "ordo_transactions_total"))


def storage_memory(samples: dict) -> dict[str, int]:
    """RocksDB's memory summed over the partitions, by kind."""
    memory: dict[str, int] = {}
    for (name, labels), value in samples.items():
        kind = dict(labels).get("kind")
        if name == "ordo_partition_memory_bytes" and kind != "resident":
            memory[kind] = memory.get(kind, 0) + int(value)
    return memory


def process_roles(engine_pid: int, broker_pids: list[int]) -> dict[str, list[int]]:
    """The engine, its sequencer and its Ray processes, and the broker, by role."""
    import psutil

    roles: dict[str, list[int]] = {"engine": [engine_pid], "sequencer": [], "ray": [], "broker": list(broker_pids)}
    try:
        children = psutil.Process(engine_pid).children(recursive=True)
    except psutil.Error:
        return roles
    for child in children:
        try:
            command = " ".join(child.cmdline())
        except psutil.Error:
            continue
        roles["sequencer" if " sequence" in command else "ray"].append(child.pid)
    return roles


def resident_mb(pids: list[int]) -> float:
    import psutil

    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def growth(samples: list[dict], role: str) -> tuple[float, float]:
    """MB per 100,000 requests answered over the first and the second half of the samples."""

    def slope(first: dict, last: dict) -> float:
        done = last["answered"] - first["answered"]
        return 0.0 if done <= 0 else (last["rss_mb"][role] - first["rss_mb"][role]) * 100_000 / done

    middle = len(samples) // 2
    return slope(samples[0], samples[middle]), slope(samples[middle], samples[-1])


class _Engine:
    """`ordo run` as a child process, with its standard error kept and its metrics address."""

    def __init__(self, command: list[str]):
        from ordo.lifeline import stop_with_owner

        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        stop_with_owner([self.process.pid])  # its sequencer and its Ray go with it
        self.lines: list[str] = []
        self.metrics_url: str | None = None
        self.serving = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip())
            match = _METRICS_LINE.search(line)
            if match:
                self.metrics_url = match.group(1)
            if line.startswith("ordo serving:"):
                self.serving.set()

    def scrape(self) -> dict:
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
                return parse_metrics(response.read().decode())
        except OSError as exc:  # URLError included: most often the engine is gone, and its last line says why
            try:
                code = self.process.wait(5)
            except subprocess.TimeoutExpired:
                raise RuntimeError(
                    f"ordo run's metrics at {self.metrics_url} do not answer ({exc}): {self.last_line()}"
                ) from None
            raise RuntimeError(f"ordo run exited with {code}: {self.last_line()}") from None

    def last_line(self) -> str:
        return self.lines[-1] if self.lines else "no output"

    def stop(self) -> int:
        self.process.terminate()
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


class Bouncer:
    """Stops the broker's node every `every` seconds (SIGTERM and SIGKILL in turn), starts
    it again on its data after `down` seconds, and notes how long the engine then took to
    answer a new request."""

    def __init__(self, broker, engine: _Engine, every: float, down: float):
        self.broker, self.engine, self.every, self.down = broker, engine, every, down
        self.events: list[dict] = []
        self.failure: str | None = None  # why the soak cannot go on: the broker did not come back
        self._stop = threading.Event()
        self._done = threading.Event()  # no bounce under way, none to come
        # A node dies with the thread that started it (its parent-death signal, see
        # kafka_broker._stop_with_parent): the thread that restarts it lives until the
        # broker is stopped.
        self._released = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Bouncer:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        """No more bounces; returns once the one under way, if any, is over."""
        self._stop.set()
        self._done.wait(300)

    def release(self) -> None:
        """The broker is stopped: the thread may end."""
        self._released.set()
        self._thread.join(10)

    def _run(self) -> None:
        try:
            self._bounce_until_stopped()
        finally:
            self._done.set()
        self._released.wait()

    def _bounce_until_stopped(self) -> None:
        while not self._stop.wait(self.every):
            how = ("SIGTERM", "SIGKILL")[len(self.events) % 2]
            at = time.monotonic()
            node = self.broker.nodes[0]
            node.stop() if how == "SIGTERM" else node.kill()
            time.sleep(self.down)
            try:
                self.broker.restart_node(0, RESTART_WAIT_S)
            except RuntimeError as exc:
                self.failure = (
                    f"the broker did not serve again within {RESTART_WAIT_S:.0f} s of its restart after "
                    f"the {how} at {at - self._started:.0f} s: {str(exc).splitlines()[0]}"
                )
                return
            back = time.monotonic()
            try:
                before = answered(self.engine.scrape())
                while answered(self.engine.scrape()) <= before and not self._stop.is_set():
                    time.sleep(0.2)
            except RuntimeError as exc:
                self.failure = f"after the {how} at {at - self._started:.0f} s: {exc}"
                return
            event = {
                "t": round(at - self._started, 1),
                "how": how,
                "down_s": round(back - at, 1),
                "resume_s": round(time.monotonic() - back, 1),
            }
            self.events.append(event)
            say(
                f"  broker bounced ({how}) at {event['t']:.0f} s, away {event['down_s']:.1f} s; answering again "
                f"{event['resume_s']:.1f} s after it was back"
            )


def check_exactly_once(bootstrap: str, namespace: str, data_dir: str, count: int) -> dict[str, Any]:
    """Every request has exactly one outcome, and the engine's state equals a serial
    reading of the log (the engine is stopped)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from ordo.embedded import read_log
    from ordo.procedures.registry import default_registry
    from ordo.scheduler.reference import SerialInterpreter
    from ordo.broker.clients import consumer_config
    from ordo.broker.topics import Topics
    from ordo.state import digest

    topic = Topics(namespace).results
    consumer = Consumer(
        consumer_config(
            bootstrap,
            {"group.id": f"{namespace}-soak-check", "enable.auto.commit": False, "isolation.level": "read_committed"},
        )
    )
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    outcomes: dict[str, int] = {}
    seen: dict[str, list] = {}  # every outcome of an id, to name a request answered twice
    last_batch = 0
    deadline = time.monotonic() + DRAIN_S
    try:
        while time.monotonic() < deadline:
            messages = consumer.consume(10_000, 2.0)
            if not messages and len(outcomes) >= count:
                break  # all answered, and the topic's end read: a second outcome would be there
            for message in messages:
                if message.error() is None:
                    record = json.loads(message.value())
                    outcomes[record["id"]] = outcomes.get(record["id"], 0) + 1
                    answer = [record.get("status"), record.get("error"), record.get("batch"), record.get("txn")]
                    seen.setdefault(record["id"], []).append(answer)
                    last_batch = max(last_batch, record.get("batch", 0))
    finally:
        consumer.close()
    repeated = {i for i, n in outcomes.items() if n > 1}
    # A request the benchmark's producer wrote twice (a retry across a broker bounce that the
    # broker took twice) is two requests: the repeat is answered `duplicate request id`.
    records = _records_of(bootstrap, Topics(namespace).requests, repeated) if repeated else {}
    sent_twice = {i for i in repeated if records.get(i, 0) == outcomes[i] and _one_then_duplicates(seen[i])}
    twice = sorted(repeated - sent_twice)
    reference = SerialInterpreter(default_registry()).apply(read_log(bootstrap, namespace, last_batch, timeout=300))
    state, applied = digest(data_dir)
    return {
        "answered": len(outcomes),
        "answered_twice": len(twice),
        # which, and how: [status, error, batch, txn] of each outcome (at most 5 ids)
        "twice": {i: seen[i] for i in twice[:5]},
        "sent_twice": len(sent_twice),
        "last_batch": last_batch,
        "applied_batch": applied,
        "state_equals_serial_reading": state == reference.digest(),
    }


def _sent_twice(check: dict) -> str:
    n = check.get("sent_twice", 0)
    return f" ({n} written twice by the benchmark's producer, each repeat answered as a duplicate)" if n else ""


def _one_then_duplicates(answers: list[list]) -> bool:
    """One outcome of the request itself, every other a rejection of a repeat of its id."""
    repeats = [a for a in answers if a[0] == "rejected" and str(a[1]).startswith("duplicate request id")]
    return len(repeats) == len(answers) - 1


def _records_of(bootstrap: str, topic: str, ids: set[str]) -> dict[str, int]:
    """How many records of `topic` carry each of `ids`."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from ordo.broker.clients import consumer_config

    consumer = Consumer(consumer_config(bootstrap, {"group.id": f"{topic}-soak-check", "enable.auto.commit": False}))
    counts: dict[str, int] = {}
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        left = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + DRAIN_S
        while left and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 1.0):
                if message.error() is not None:
                    continue
                if message.offset() + 1 >= ends[message.partition()]:
                    left.discard(message.partition())
                try:
                    request_id = json.loads(message.value()).get("id")
                except (ValueError, AttributeError):
                    continue
                if request_id in ids:
                    counts[request_id] = counts.get(request_id, 0) + 1
    finally:
        consumer.close()
    return counts


def run_soak(
    workload: str,
    rate: float,
    seconds: float,
    partitions: int,
    scheduler: str,
    every: float,
    seed: int,
    knobs: dict,
    json_path: str | None,
    bounce_every: float | None = None,
    down: float = 15.0,
) -> dict[str, Any]:
    from confluent_kafka import Producer

    from ordo.broker.local import local_broker
    from ordo.broker.clients import kafka_config
    from ordo.broker.topics import Topics

    count = int(rate * seconds)
    report: dict[str, Any] = {
        "bench": "soak",
        "workload": workload,
        "rate": rate,
        "seconds": seconds,
        "partitions": partitions,
        "scheduler": scheduler,
        "machine": machine(),
    }
    say(
        f"ordo bench soak {workload}: {count:,} requests at {rate:,.0f}/s for {seconds:,.0f} s, "
        f"{partitions} partition(s), {scheduler}; a sample every {every:.0f} s"
        + (
            f"; every {bounce_every:.0f} s the broker is stopped and started again {down:.0f} s later"
            if bounce_every
            else ""
        )
    )
    directory = tempfile.mkdtemp(prefix="ordo-soak-")
    namespace = "soak"
    bouncer = None
    try:
        with local_broker("kafka" if bounce_every else None) as broker:
            engine = _Engine(
                [
                    sys.executable,
                    "-m",
                    "ordo.cli",
                    "run",
                    "--bootstrap-servers",
                    broker.bootstrap_servers,
                    "--namespace",
                    namespace,
                    "--data-dir",
                    f"{directory}/data",
                    "--scheduler",
                    scheduler,
                    "--partitions",
                    str(partitions),
                    "--metrics-port",
                    "0",
                    "--quiet",
                    "--workloads",
                    workload,
                ]
            )
            try:
                if not engine.serving.wait(180) or engine.metrics_url is None:
                    raise RuntimeError(f"ordo run did not start serving within 180 s: {engine.last_line()}")
                # Requests wait in the producer while the broker is bounced: none expires.
                producer = Producer(
                    kafka_config(
                        broker.bootstrap_servers, {"enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 0}
                    )
                )
                broker_pids = lambda: [node.pid for node in getattr(broker, "nodes", ()) if node.pid]  # noqa: E731
                bouncer = Bouncer(broker, engine, bounce_every, down).start() if bounce_every else None
                try:
                    report["samples"] = _drive(
                        engine,
                        broker_pids,
                        producer,
                        Topics(namespace).requests,
                        workload,
                        knobs,
                        partitions,
                        seed,
                        rate,
                        count,
                        every,
                        lambda: bouncer.failure if bouncer is not None else None,
                    )
                finally:
                    if bouncer is not None:
                        bouncer.stop()
                        report["bounces"] = bouncer.events
            finally:
                report["engine_exit"] = engine.stop()
            if bounce_every:
                report["check"] = check_exactly_once(broker.bootstrap_servers, namespace, f"{directory}/data", count)
    finally:
        if bouncer is not None:
            bouncer.release()
        shutil.rmtree(directory, ignore_errors=True)
    samples = report["samples"]
    report["growth_mb_per_100k"] = {
        role: growth(samples, role) for role in samples[-1]["rss_mb"] if all(role in s["rss_mb"] for s in samples)
    }
    say(format_report(report))
    finish_report(report, json_path)
    check = report.get("check")
    if check is not None and (
        check["answered"] != count or check["answered_twice"] or not check["state_equals_serial_reading"]
    ):
        raise RuntimeError(f"the soak with broker bounces did not hold: {check}")
    return report


def _drive(
    engine: _Engine,
    broker_pids: Callable[[], list[int]],
    producer,
    topic: str,
    workload: str,
    knobs: dict,
    partitions: int,
    seed: int,
    rate: float,
    count: int,
    every: float,
    failure: Callable[[], str | None] = lambda: None,
) -> list[dict]:
    chunk: dict[str, Any] = {"at": -1, "requests": []}

    def send(i: int) -> None:
        if failure() is not None:
            raise _Abandoned

        at = i // CHUNK
        if chunk["at"] != at:  # distinct seeds give distinct request ids
            chunk["at"], chunk["requests"] = (
                at,
                encode_requests(workload_requests(workload, CHUNK, seed * 1_000_003 + at, knobs, partitions)),
            )
        key, value = chunk["requests"][i % CHUNK]
        while True:
            try:
                producer.produce(topic, key=key.encode(), value=value)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)

    def sample() -> dict:
        if failure() is not None:
            raise RuntimeError(failure())
        return _sample(engine, broker_pids, started)

    def send_all() -> None:
        try:
            open_loop(send, rate, count)
        except _Abandoned:
            pass

    sender = threading.Thread(target=send_all, daemon=True)
    started = time.monotonic()
    samples = [sample()]
    sender.start()
    while sender.is_alive():
        sender.join(every - (time.monotonic() - started) % every)
        if sender.is_alive():
            samples.append(sample())
    unsent = producer.flush(60)
    deadline = time.monotonic() + DRAIN_S
    last = sample()
    while last["answered"] < count and time.monotonic() < deadline:
        time.sleep(1)
        last = sample()
    samples.append(last)
    if last["answered"] < count:
        held = f"; {unsent:,} were still in the benchmark's producer 60 s after the last send" if unsent else ""
        raise RuntimeError(
            f"only {last['answered']:,} of {count:,} requests were answered within {DRAIN_S:.0f} s of the last "
            f"send{held}; the engine's last line: {engine.last_line()}"
        )
    return samples


class _Abandoned(Exception):
    """The soak cannot go on (Bouncer.failure): the sender stops."""


def _sample(engine: _Engine, broker_pids: Callable[[], list[int]], started: float) -> dict:
    if engine.process.poll() is not None:
        raise RuntimeError(f"ordo run exited with {engine.process.returncode}: {engine.last_line()}")
    metrics = engine.scrape()
    roles = process_roles(engine.process.pid, broker_pids())
    return {
        "t": round(time.monotonic() - started, 1),
        "answered": answered(metrics),
        "rss_mb": {role: round(resident_mb(pids), 1) for role, pids in roles.items() if pids},
        "rocksdb_mb": {kind: round(v / 2**20, 1) for kind, v in storage_memory(metrics).items()},
    }


def format_report(report: dict[str, Any]) -> str:
    samples = report["samples"]
    roles = list(samples[-1]["rss_mb"])
    kinds = list(samples[-1]["rocksdb_mb"])
    lines = [
        "  "
        + "  ".join(
            [
                f"{'t (s)':>7}",
                f"{'answered':>10}",
                *(f"{r + ' MB':>12}" for r in roles),
                *(f"{k + ' MB':>16}" for k in kinds),
            ]
        )
    ]
    for s in samples:
        lines.append(
            "  "
            + "  ".join(
                [
                    f"{s['t']:>7.0f}",
                    f"{s['answered']:>10,}",
                    *(f"{s['rss_mb'].get(r, 0):>12.1f}" for r in roles),
                    *(f"{s['rocksdb_mb'].get(k, 0):>16.1f}" for k in kinds),
                ]
            )
        )
    lines.append(
        "  resident growth, MB per 100,000 requests (first half, second half): "
        + "; ".join(f"{role} {a:+.2f}, {b:+.2f}" for role, (a, b) in report["growth_mb_per_100k"].items())
    )
    if "bounces" in report:
        resumes = [event["resume_s"] for event in report["bounces"]]
        check = report["check"]
        lines.append(
            f"  {len(resumes)} broker bounce(s); answering again after "
            f"{', '.join(f'{s:.1f}' for s in resumes) or '-'} s; {check['answered']:,} of "
            f"{int(report['rate'] * report['seconds']):,} requests answered, {check['answered_twice']} "
            f"twice{_sent_twice(check)}; state "
            f"{'equal to' if check['state_equals_serial_reading'] else 'DIFFERENT from'} a serial reading "
            f"of the log's {check['last_batch']:,} batches"
        )
    return "\n".join(lines)


def say(text: str = "") -> None:
    print(text, flush=True)
