"""Apache Kafka keeps Ordo's log: brokers restarted, killed and stopped under load, with real
processes and real signals, lose and repeat nothing. Each request gets exactly one outcome and
enters the log once, and the engine's state equals an independent serial reading of the log."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from ordo.client import Client
from ordo.embedded import read_log
from ordo.procedures.workloads import sl
from ordo.sequencer.kafka_broker import KafkaCluster
from tests.helpers import dump_state, interpret_log, ordo, read_results, reference_state, stop

pytestmark = pytest.mark.slow


class Feeder:
    """Submits `requests` in slices through Ordo's client, a slice every `pause` seconds,
    whatever the broker is doing (the client's producer holds what it cannot send yet). The
    feed outlasts the faults, so that the time to resume after each is measurable."""

    def __init__(self, bootstrap: str, namespace: str, requests: list, slice_size: int, pause: float):
        self.client = Client(bootstrap, namespace)
        self.requests, self.slice_size, self.pause = requests, slice_size, pause
        self.thread = threading.Thread(target=self._feed, daemon=True)

    def _feed(self) -> None:
        for start in range(0, len(self.requests), self.slice_size):
            self.client.submit(self.requests[start:start + self.slice_size])
            time.sleep(self.pause)

    def start(self) -> Feeder:
        self.thread.start()
        return self

    def finish(self, timeout: float = 180) -> None:
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
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "fault-watch",
                             "enable.auto.commit": False, "isolation.level": "read_committed",
                             "auto.offset.reset": "earliest", "fetch.wait.max.ms": 20})
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


def settle_and_check(feeder: Feeder, watch: OutcomeWatch, engine, bootstrap: str, namespace: str, requests: list,
                     data_dir: str) -> None:
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
    engine = ordo("run", "--bootstrap-servers", bootstrap, "--namespace", namespace, "--data-dir", data_dir,
                  "--quiet", "--runtime", "local", "--max-txns", "100")
    requests = list(sl.generate(4000, seed=11))
    feeder = watch = None
    resumed = []
    try:
        client = Client(bootstrap, namespace)
        client.wait_for_topics(timeout=60)
        client.close()
        feeder = Feeder(bootstrap, namespace, requests, slice_size=50, pause=0.4).start()
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
            resumed.append(watch.first_after(back, engine))
        settle_and_check(feeder, watch, engine, bootstrap, namespace, requests, data_dir)
    finally:
        clean_up(feeder, watch, engine, kafka)
    fault_report(f"2 broker restarts (SIGTERM, SIGKILL), {len(requests)} requests checked, first outcome "
                 f"{', '.join(f'{s:.1f}' for s in resumed)} s after the broker was started again")


def test_a_three_node_cluster_loses_no_request_when_the_log_leader_dies_and_another_node_stops(
        tmp_path, fault_report):
    kafka = KafkaCluster(nodes=3, data_dir=str(tmp_path / "kafka"))
    bootstrap = kafka.start()
    namespace, data_dir = "replicated", str(tmp_path / "d")
    engine = ordo("run", "--bootstrap-servers", bootstrap, "--namespace", namespace, "--data-dir", data_dir,
                  "--quiet", "--runtime", "local", "--max-txns", "100", "--log-replication", "3")
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
        (future,) = admin.describe_configs([ConfigResource("topic", log)]).values()
        assert future.result(10)["min.insync.replicas"].value == "2"
        feeder = Feeder(bootstrap, namespace, requests, slice_size=50, pause=0.4).start()
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
            resumed.append(watch.first_after(back, engine, timeout=180))
        settle_and_check(feeder, watch, engine, bootstrap, namespace, requests, data_dir)
    finally:
        clean_up(feeder, watch, engine, kafka)
    fault_report(f"{rounds} rounds of SIGKILL of the log's leader + SIGSTOP of another node "
                 f"({2 * rounds} faults), {len(requests)} requests checked, 0 lost, 0 duplicated; first outcome "
                 f"{', '.join(f'{s:.1f}' for s in resumed)} s after the stopped node went on and the killed one was restarted")


def test_a_broker_stopped_for_longer_than_the_grace_is_not_called_lost(tmp_path):
    """A stopped broker says nothing about the records it holds: the engine waits for it
    (it never says "the broker lost the log"), and goes on when the broker is back."""
    import subprocess

    kafka = KafkaCluster(data_dir=str(tmp_path / "kafka"))
    bootstrap = kafka.start()
    namespace, data_dir = "stopped", str(tmp_path / "d")
    engine = ordo("run", "--bootstrap-servers", bootstrap, "--namespace", namespace, "--data-dir", data_dir,
                  "--quiet", "--runtime", "local", stderr=subprocess.PIPE, text=True)
    try:
        with Client(bootstrap, namespace) as client:
            client.wait_for_topics(timeout=60)
            assert client.wait_one(client.submit("sl_deposit", {"account": 1, "asset": 1, "account_amount": 5,
                                                               "asset_amount": 5}), timeout=60)["status"] == "committed"
        kafka.nodes[0].stop()
        time.sleep(45)  # longer than the grace a missing record gets (log_probe.ABSENT_GRACE, 30 s)
        assert engine.poll() is None, engine.stderr.read()
        kafka.restart_node(0)
        with Client(bootstrap, namespace) as client:
            outcome = client.wait_one(client.submit("sl_deposit", {"account": 2, "asset": 2, "account_amount": 5,
                                                                   "asset_amount": 5}), timeout=120)
        assert outcome["status"] == "committed"
    finally:
        code = stop(engine)
        kafka.stop()
    said = engine.stderr.read()
    assert "lost the log" not in said, said
    assert code == 0, said
