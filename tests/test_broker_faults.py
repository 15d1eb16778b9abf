"""Apache Kafka keeps Ordo's log: brokers restarted, killed and stopped under load, with real
processes and real signals, lose and repeat nothing. Each request gets exactly one outcome and
enters the log once, and the engine's state equals an independent serial reading of the log."""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from ordo.client import Client
from ordo.errors import OutcomeTimeout
from ordo.embedded import read_log
from ordo.procedures.workloads import sl
from ordo.broker.apache_kafka import KafkaCluster
from ordo.log.probe import ABSENT_GRACE
from tests.helpers import dump_state, interpret_log, ordo, read_results, reference_state, stop

pytestmark = pytest.mark.slow


class Feeder:
    """Submits `requests` in slices through Ordo's client, a slice every `pause` seconds,
    whatever the broker is doing: each slice waits, however long a broker restarted under
    load takes to answer, while the client's producer holds what it cannot send yet.
    The last `held` slices are held back, one sent by each `after_fault`: however long the
    faults take under load, new requests come after each, so the time to resume after it
    is measurable (a feed that ended before a fault was over left nothing to answer)."""

    def __init__(self, bootstrap: str, namespace: str, requests: list, slice_size: int, pause: float, held: int = 0):
        cut = len(requests) - held * slice_size
        self.client = Client(bootstrap, namespace)
        self.requests, self.slice_size, self.pause = requests[:cut], slice_size, pause
        self._held = [requests[start : start + slice_size] for start in range(cut, len(requests), slice_size)]
        self._faults_over: queue.Queue = queue.Queue()
        self._faults = 0
        self.thread = threading.Thread(target=self._feed, daemon=True)

    def _feed(self) -> None:
        for start in range(0, len(self.requests), self.slice_size):
            self.client.submit(self.requests[start : start + self.slice_size], timeout=None)
            time.sleep(self.pause)
        for held in self._held:  # by this thread's client, which knows where its outcomes begin
            self._faults_over.get()
            self.client.submit(held, timeout=None)

    def start(self) -> Feeder:
        self.thread.start()
        return self

    def after_fault(self) -> None:
        self._faults_over.put(None)
        self._faults += 1

    def finish(self, timeout: float = 180) -> None:
        assert self._faults == len(self._held), "a held slice has no fault to follow"
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the client could not hand over its requests"
        self.client.close()


class OutcomeWatch:
    """Reads the results topic in the background and notes when each outcome arrived: the
    time the pipeline took to resume after a fault is the gap until the next new one."""

    def __init__(self, bootstrap: str, topic: str):
        self.bootstrap, self.topic = bootstrap, topic
        self.arrivals: list[float] = []
        self.records: list[dict] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        # librdkafka rides out a broker restart on its own; each arrival is only a time here.
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "fault-watch",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 20,
            }
        )
        consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        try:
            while not self._stop.is_set():
                message = consumer.poll(0.2)
                if message is not None and message.error() is None:
                    self.records.append(json.loads(message.value()))
                    self.arrivals.append(time.monotonic())
        finally:
            consumer.close()

    def start(self) -> OutcomeWatch:
        self.thread.start()
        return self

    def first_after(self, moment: float, engine, timeout: float = 120) -> float:
        """Seconds from `moment` to the first outcome that arrived after it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert engine.poll() is None, f"ordo run stopped (exit {engine.returncode}); its stderr is above"
            later = [t for t in self.arrivals[-2000:] if t > moment]
            if later:
                return min(later) - moment
            time.sleep(0.05)
        raise AssertionError(f"no outcome within {timeout:.0f} s after the fault was over")

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)


def assert_exactly_once(bootstrap: str, namespace: str, requests: list, records: list[dict], data_dir: str) -> None:
    per_id = Counter(record["id"] for record in records)
    assert set(per_id) == {r["id"] for r in requests}, f"{len(set(per_id))} of {len(requests)} answered"
    assert max(per_id.values()) == 1, [i for i, n in per_id.items() if n > 1][:5]
    assert {r["status"] for r in records} <= {"committed", "aborted"}
    last_batch = max(r["batch"] for r in records)
    in_log = Counter(entry[0] for batch in read_log(bootstrap, namespace, last_batch) for entry in batch.entries)
    assert set(in_log) == set(per_id) and max(in_log.values()) == 1
    assert dump_state(data_dir) == reference_state(interpret_log(bootstrap, namespace, last_batch))


def settle_and_check(
    feeder: Feeder, watch: OutcomeWatch, engine, bootstrap: str, namespace: str, requests: list, data_dir: str
) -> None:
    """Once the faults are over: every request handed over, answered once, and checked."""
    feeder.finish()
    records = read_results(bootstrap, f"{namespace}.results", len(requests), timeout=240)
    watch.stop()
    assert engine.poll() is None, "ordo run stopped although the log was kept"
    stop(engine, timeout=60)
    assert_exactly_once(bootstrap, namespace, requests, records, data_dir)


def clean_up(feeder: Feeder | None, watch: OutcomeWatch | None, engine, kafka: KafkaCluster) -> None:
    if feeder is not None and feeder.thread.is_alive():
        feeder.thread.join(5)
    if watch is not None:
        watch.stop()
    stop(engine, timeout=60)
    kafka.stop()


def test_a_durable_broker_restarted_under_load_loses_and_repeats_nothing(tmp_path, fault_report):
    kafka = KafkaCluster(data_dir=str(tmp_path / "kafka"))
    bootstrap = kafka.start()
    namespace, data_dir = "durable", str(tmp_path / "d")
    engine = ordo(
        "run",
        "--bootstrap-servers",
        bootstrap,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--quiet",
        "--runtime",
        "local",
        "--max-txns",
        "100",
    )
    requests = list(sl.generate(4000, seed=11))
    feeder = watch = None
    resumed = []
    try:
        client = Client(bootstrap, namespace)
        client.wait_for_topics(timeout=60)
        client.close()
        feeder = Feeder(bootstrap, namespace, requests, slice_size=50, pause=0.4, held=2).start()
        watch = OutcomeWatch(bootstrap, f"{namespace}.results").start()
        for fault in ("SIGTERM", "SIGKILL"):
            time.sleep(3)
            node = kafka.nodes[0]
            if fault == "SIGTERM":
                node.stop()
            else:
                node.kill()
            time.sleep(2)
            back = time.monotonic()
            kafka.restart_node(0)
            feeder.after_fault()
            resumed.append(watch.first_after(back, engine))
        settle_and_check(feeder, watch, engine, bootstrap, namespace, requests, data_dir)
    finally:
        clean_up(feeder, watch, engine, kafka)
    fault_report(
        f"2 broker restarts (SIGTERM, SIGKILL), {len(requests)} requests checked, first outcome "
        f"{', '.join(f'{s:.1f}' for s in resumed)} s after the broker was started again"
    )


def test_a_three_node_cluster_loses_no_request_when_the_log_leader_dies_and_another_node_stops(tmp_path, fault_report):
    kafka = KafkaCluster(nodes=3, data_dir=str(tmp_path / "kafka"))
    bootstrap = kafka.start()
    namespace, data_dir = "replicated", str(tmp_path / "d")
    engine = ordo(
        "run",
        "--bootstrap-servers",
        bootstrap,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--quiet",
        "--runtime",
        "local",
        "--max-txns",
        "100",
        "--log-replication",
        "3",
    )
    requests = list(sl.generate(4000, seed=12))
    rounds, resumed, feeder, watch = 2, [], None, None
    try:
        client = Client(bootstrap, namespace)
        client.wait_for_topics(timeout=90)
        client.close()
        admin = AdminClient({"bootstrap.servers": bootstrap})
        log = f"{namespace}.log"
        deadline = time.monotonic() + 30
        while not (partitions := admin.list_topics(log, timeout=10).topics[log].partitions):
            assert time.monotonic() < deadline, f"{log} has no partitions"
            time.sleep(0.1)
        assert len(partitions[0].replicas) == 3
        while True:  # a node that has not learned of the new topic yet answers "unknown topic"
            (future,) = admin.describe_configs([ConfigResource("topic", log)]).values()
            try:
                assert future.result(10)["min.insync.replicas"].value == "2"
                break
            except KafkaException:
                assert time.monotonic() < deadline, f"{log}'s settings cannot be described"
                time.sleep(0.2)
        feeder = Feeder(bootstrap, namespace, requests, slice_size=50, pause=0.4, held=rounds).start()
        watch = OutcomeWatch(bootstrap, f"{namespace}.results").start()
        for round_ in range(rounds):
            time.sleep(3)
            leader = kafka.leader_of(f"{namespace}.log")
            paused = (leader + 1 + round_) % 3
            kafka.nodes[leader].kill()
            kafka.nodes[paused].signal(signal.SIGSTOP)
            time.sleep(3)  # one node of three left: no quorum, no in-sync pair; nothing may be lost
            kafka.nodes[paused].signal(signal.SIGCONT)
            back = time.monotonic()
            # The killed leader comes back at once: which two nodes form the in-sync pair after
            # a pause is the cluster's choice, and it may need that one.
            kafka.restart_node(leader)
            feeder.after_fault()
            resumed.append(watch.first_after(back, engine, timeout=180))
        settle_and_check(feeder, watch, engine, bootstrap, namespace, requests, data_dir)
    finally:
        clean_up(feeder, watch, engine, kafka)
    fault_report(
        f"{rounds} rounds of SIGKILL of the log's leader + SIGSTOP of another node "
        f"({2 * rounds} faults), {len(requests)} requests checked, 0 lost, 0 duplicated; first outcome "
        f"{', '.join(f'{s:.1f}' for s in resumed)} s after the stopped node went on and the killed one was restarted"
    )


def test_a_broker_stopped_for_longer_than_the_grace_is_not_called_lost(tmp_path):
    """A stopped broker says nothing about the records it holds: the engine waits for it
    (it never says "the broker lost the log"), and goes on when the broker is back."""
    import subprocess

    kafka = KafkaCluster(data_dir=str(tmp_path / "kafka"))
    bootstrap = kafka.start()
    namespace, data_dir = "stopped", str(tmp_path / "d")
    engine = ordo(
        "run",
        "--bootstrap-servers",
        bootstrap,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--quiet",
        "--runtime",
        "local",
        stderr=subprocess.PIPE,
        text=True,
    )
    said = Lines(engine.stderr)
    try:
        with Client(bootstrap, namespace) as client:
            client.wait_for_topics(timeout=60)
            assert (
                client.wait_one(
                    client.submit("sl_deposit", {"account": 1, "asset": 1, "account_amount": 5, "asset_amount": 5}),
                    timeout=60,
                )["status"]
                == "committed"
            )
            kafka.nodes[0].stop()
            time.sleep(ABSENT_GRACE + 15)  # longer than the grace a missing record gets
            assert engine.poll() is None, "\n".join(said.lines)
            kafka.restart_node(0)
            back = time.monotonic()
            # The client that was there before the stop: it knows where its outcomes begin.
            request = client.submit(
                "sl_deposit", {"account": 2, "asset": 2, "account_amount": 5, "asset_amount": 5}, timeout=None
            )
            try:
                outcome = client.wait_one(request, timeout=180)
            except OutcomeTimeout as exc:
                raise AssertionError(f"{exc}; the engine said:\n" + "\n".join(said.lines)) from None
            print(f"first outcome {time.monotonic() - back:.1f} s after the broker served again")
        assert outcome["status"] == "committed"
    finally:
        code = stop(engine)
        kafka.stop()
    said.thread.join(10)
    text = "\n".join(said.lines)
    assert "lost the log" not in text, text
    assert code == 0, text


class Lines:
    """The lines a process writes to a pipe, read as they come (a full pipe would block it)."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def having(self, words: str) -> list[str]:
        return [line for line in self.lines if words in line]


def _sequencer_pid(engine) -> int:
    import psutil

    (child,) = [c for c in psutil.Process(engine.pid).children() if "sequence" in c.cmdline()]
    return child.pid


def test_a_broker_away_for_90_s_under_ordo_run_is_waited_for_and_nothing_is_lost_or_doubled(tmp_path, fault_report):
    """A durable broker stopped for 90 s under `ordo run`, its sequencer restarted while the
    broker is away: the engine says the broker went away, once a minute that it is still
    away, and that it is back, and never gives up; requests submitted before, during (the
    client holds them) and after are each answered once, the state equal to a serial
    reading of the log."""
    import subprocess

    kafka = KafkaCluster(data_dir=str(tmp_path / "kafka"))
    bootstrap = kafka.start()
    namespace, data_dir, away = "weather", str(tmp_path / "d"), 90.0
    engine = ordo(
        "run",
        "--bootstrap-servers",
        bootstrap,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--quiet",
        "--runtime",
        "local",
        "--max-txns",
        "100",
        stderr=subprocess.PIPE,
        text=True,
    )
    said = Lines(engine.stderr)
    requests = list(sl.generate(1200, seed=13))
    before, during, after = requests[:400], requests[400:800], requests[800:]
    held: dict[str, dict] = {}
    try:
        with Client(bootstrap, namespace) as client:
            client.wait_for_topics(timeout=60)
            client.submit(before, timeout=None)
            client.wait([r["id"] for r in before[:10]], timeout=120)
        kafka.nodes[0].stop()
        stopped = time.monotonic()
        time.sleep(5)
        # The sequencer dies while the broker is away: its restarts meet no broker.
        sequencer_pid = _sequencer_pid(engine)
        os.kill(sequencer_pid, signal.SIGKILL)
        during_client = Client(bootstrap, namespace)
        submitting = threading.Thread(
            target=during_client.submit, args=(during,), kwargs={"timeout": None}, daemon=True
        )
        submitting.start()

        def wait_through_the_outage() -> None:
            with Client(bootstrap, namespace) as waiting:
                held.update(waiting.outcomes([r["id"] for r in during], timeout=None))

        waiter = threading.Thread(target=wait_through_the_outage, daemon=True)
        waiter.start()
        while time.monotonic() - stopped < away:
            assert engine.poll() is None, "\n".join(said.lines)
            time.sleep(1)
        back = time.monotonic()
        kafka.restart_node(0)
        submitting.join(120)
        assert not submitting.is_alive(), "the client did not hand over the requests it held"
        during_client.close()
        with Client(bootstrap, namespace) as client:
            client.submit(after, timeout=None)
        records = read_results(bootstrap, f"{namespace}.results", len(requests), timeout=240)
        resumed = time.monotonic() - back
        waiter.join(120)
        assert set(held) == {r["id"] for r in during}, f"{len(held)} of {len(during)} outcomes waited for"
        assert engine.poll() is None, "\n".join(said.lines)
        assert stop(engine, timeout=60) == 0
        assert_exactly_once(bootstrap, namespace, requests, records, data_dir)
    finally:
        stop(engine, timeout=60)
        kafka.stop()
    said.thread.join(10)
    gone, still, again = (
        said.having(words) for words in ("does not answer; waiting", "has not answered for", "answers again after")
    )
    assert len(gone) == 1 and len(again) == 1, "\n".join(said.lines)
    assert 1 <= len(still) <= 2, "\n".join(said.lines)
    assert not said.having("not restarting it"), "\n".join(said.lines)
    fault_report(
        f"broker stopped {away:.0f} s under ordo run, sequencer SIGKILLed while it was away (restarted "
        f"once the broker answered); {len(requests)} requests (400 before, 400 held by the client during, "
        f"400 after) answered exactly once, state equal to the serial reading; all outcomes "
        f"{resumed:.1f} s after the broker was started again; said: {gone[0]!r}, {len(still)} reminder(s), "
        f"{again[0]!r}"
    )


def test_ordo_broker_with_three_nodes_restarts_a_killed_node_while_the_others_serve(tmp_path, fault_report):
    """`ordo broker --nodes 3` under `ordo run` with a replicated namespace: one node's JVM
    SIGKILLed (the log's leader). The launcher says so in one line and starts it again, the
    other two serve on; every request is answered once, the state equal to a serial
    reading of the log."""
    import subprocess

    import psutil
    from confluent_kafka.admin import AdminClient

    launcher = ordo(
        "broker",
        "--nodes",
        "3",
        "--data-dir",
        str(tmp_path / "kafka"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    first = launcher.stdout.readline()
    assert first.startswith("broker listening on "), first
    bootstrap = first.split()[3]
    said = Lines(launcher.stdout)
    namespace, data_dir = "nodes", str(tmp_path / "d")
    engine = ordo(
        "run",
        "--bootstrap-servers",
        bootstrap,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--quiet",
        "--runtime",
        "local",
        "--max-txns",
        "100",
        "--log-replication",
        "3",
    )
    requests = list(sl.generate(3000, seed=14))
    feeder = watch = None
    try:
        client = Client(bootstrap, namespace)
        client.wait_for_topics(timeout=90)
        client.close()
        feeder = Feeder(bootstrap, namespace, requests, slice_size=50, pause=0.4, held=1).start()
        watch = OutcomeWatch(bootstrap, f"{namespace}.results").start()
        time.sleep(5)
        log = f"{namespace}.log"
        leader = (
            AdminClient({"bootstrap.servers": bootstrap}).list_topics(log, timeout=10).topics[log].partitions[0].leader
        )
        node = next(
            p
            for p in psutil.Process(launcher.pid).children()
            if any(arg.endswith(f"node-{leader}.properties") for arg in p.cmdline())
        )
        node.kill()
        killed = time.monotonic()
        feeder.after_fault()
        resumed = watch.first_after(killed, engine, timeout=180)
        deadline = time.monotonic() + 60
        while not said.having(f"Kafka node {leader} "):
            assert launcher.poll() is None, "ordo broker stopped: " + "\n".join(said.lines)
            assert time.monotonic() < deadline, "\n".join(said.lines)
            time.sleep(0.2)
        settle_and_check(feeder, watch, engine, bootstrap, namespace, requests, data_dir)
        assert launcher.poll() is None, "\n".join(said.lines)
        restarted = [
            p
            for p in psutil.Process(launcher.pid).children()
            if any(arg.endswith(f"node-{leader}.properties") for arg in p.cmdline())
        ]
        assert len(restarted) == 1 and restarted[0].pid != node.pid
        address = bootstrap.split(",")[leader - 1]  # nodes 1, 2, 3 in the order `ordo broker` lists them
        line = f"ordo broker: Kafka node {leader} ({address}) exited (code -9); restarting it, 2 node(s) serve on"
        assert said.lines == [line], said.lines
    finally:
        if feeder is not None and feeder.thread.is_alive():
            feeder.thread.join(5)
        if watch is not None:
            watch.stop()
        stop(engine, timeout=60)
        stop(launcher, timeout=90)
    fault_report(
        f"SIGKILL of Kafka node {leader} (the log's leader) of `ordo broker --nodes 3` under ordo run "
        f"--log-replication 3: the launcher restarted it ({said.lines[0]!r}); {len(requests)} requests "
        f"answered exactly once, state equal to the serial reading; first outcome {resumed:.1f} s after the kill"
    )


def test_ordo_execute_waits_for_a_broker_away_for_80_s_and_goes_on(tmp_path, fault_report):
    """`ordo execute` (the engine without its sequencer) under a durable broker stopped
    for 80 s: it says the broker went away, once a minute that it is still away, and that it
    is back, then answers the requests sent after it; each request once, the state equal
    to a serial reading of the log."""
    import subprocess

    from ordo.broker.topics import ensure_topics

    kafka = KafkaCluster(data_dir=str(tmp_path / "kafka"))
    bootstrap = kafka.start()
    namespace, data_dir, away = "execute-weather", str(tmp_path / "d"), 80.0
    ensure_topics(bootstrap, namespace, 1)
    on_namespace = ("--bootstrap-servers", bootstrap, "--namespace", namespace)
    sequencer = ordo("sequence", *on_namespace, "--max-txns", "100", stderr=subprocess.DEVNULL)
    engine = ordo(
        "execute",
        *on_namespace,
        "--data-dir",
        data_dir,
        "--runtime",
        "local",
        "--quiet",
        stderr=subprocess.PIPE,
        text=True,
    )
    said = Lines(engine.stderr)
    requests = list(sl.generate(600, seed=15))
    before, after = requests[:300], requests[300:]
    sequencer_restarted = False
    try:
        with Client(bootstrap, namespace) as client:
            client.submit(before, timeout=None)
            assert len(client.wait([r["id"] for r in before], timeout=120)) == len(before)
        kafka.nodes[0].stop()
        stopped = time.monotonic()
        while time.monotonic() - stopped < away:
            assert engine.poll() is None, "\n".join(said.lines)
            time.sleep(1)
        kafka.restart_node(0)
        if sequencer.poll() is not None:  # a sequencer of its own is its supervisor's to restart
            sequencer_restarted = True
            sequencer = ordo("sequence", *on_namespace, "--max-txns", "100", stderr=subprocess.DEVNULL)
        with Client(bootstrap, namespace) as client:
            client.submit(after, timeout=None)
        records = read_results(bootstrap, f"{namespace}.results", len(requests), timeout=240)
        assert engine.poll() is None, "\n".join(said.lines)
        deadline = time.monotonic() + 30  # its broker watch looks every 2 s, and may have looked last just before
        while not said.having("answers again after") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert stop(engine, timeout=60) == 0
        assert_exactly_once(bootstrap, namespace, requests, records, data_dir)
    finally:
        stop(engine, timeout=60)
        stop(sequencer, timeout=60)
        kafka.stop()
    said.thread.join(10)
    gone, still, again = (
        said.having(words) for words in ("does not answer; waiting", "has not answered for", "answers again after")
    )
    assert len(gone) == 1 and len(again) == 1, "\n".join(said.lines)
    assert 1 <= len(still) <= 2, "\n".join(said.lines)  # a minute after it went away (a second if slow back)
    fault_report(
        f"broker stopped {away:.0f} s under ordo execute (sequencer apart"
        f"{', restarted after the outage' if sequencer_restarted else ', rode it out'}); {len(requests)} "
        f"requests (300 before, 300 after) answered exactly once, state equal to the serial reading; said: "
        f"{gone[0]!r}, {still[0]!r}, {again[0]!r}"
    )
