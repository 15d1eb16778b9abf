"""A sequencer learns from the log that another one took over its lane, and stops: appends
are plain idempotent writes, so no broker fences it. While it goes on, every reader drops
its batches after the newer start record alike, and the newer sequencer sequences their
requests again from the log's own positions: nothing is lost or doubled, whether it
notices the takeover busy, idle, or only after it was paused through it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter

import pytest

from ordo.client import Client
from ordo.procedures.loading import load_registry
from ordo.procedures.workloads import sl
from ordo.sequencer.lane_owner import Superseded
from ordo.log.records import LogCursor
from ordo.log.reader import LogReader
from ordo.sequencer.sequencer import Sequencer, SequencerConfig
from ordo.sequencer.takeover import STALE_APPENDS, TakeoverWatch
from ordo.broker.topics import Topics, ensure_topics
from tests.helpers import ordo, stop

pytestmark = pytest.mark.slow

REGISTRY_MODULES = ("ordo.procedures.workloads.sl",)


class Running:
    """A sequencer on a thread, keeping what ended it."""

    def __init__(self, broker: str, namespace: str, config: SequencerConfig, owner: dict):
        self.sequencer = Sequencer(broker, namespace, load_registry(REGISTRY_MODULES), config, owner=owner)
        self.sequencer.start()
        self.ended: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.sequencer.run()
        except BaseException as exc:
            self.ended = exc


def accepted_log(broker: str, namespace: str, ids: set[str], timeout: float = 60.0) -> tuple[Counter, int]:
    """How often each request id entered the log, reading until every one of `ids` did, and
    the most stale batches of a lane that readers passed over in a row (a superseded
    sequencer's, until its successor's first batch)."""
    cursor = LogCursor()
    reader = LogReader(broker, Topics(namespace).log, cursor, f"{namespace}.check", on_dropped=lambda *_: None)
    counts: Counter = Counter()
    most_stale = 0
    deadline = time.monotonic() + timeout
    try:
        while not ids <= set(counts) and time.monotonic() < deadline:
            for offset, value in reader.poll_raw(0.2, 1000):
                batch = reader.accept(offset, value)
                most_stale = max(most_stale, cursor.stale)
                if batch is not None:
                    counts.update(request_id for request_id, proc, _ in batch.entries if proc is not None)
    finally:
        reader.close()
    return counts, most_stale


@pytest.mark.parametrize("watch", ["prompt", "lagging"])
def test_a_busy_sequencer_taken_over_stops_and_its_requests_enter_the_log_once(broker, namespace, watch, monkeypatch):
    """`lagging`: every sequencer's takeover watch takes 30 ms over each record, as on a
    machine too busy to schedule its thread: the superseded one still appends at most
    STALE_APPENDS batches after the start record that took its lane over."""
    if watch == "lagging":
        ends_generation = TakeoverWatch._ends_generation

        def slowly(self, offset, value):
            time.sleep(0.03)
            return ends_generation(self, offset, value)

        monkeypatch.setattr(TakeoverWatch, "_ends_generation", slowly)
    ensure_topics(broker, namespace)
    requests = list(sl.generate(3000, seed=21))
    config = SequencerConfig(max_delay_ms=0, max_txns=40)  # group commit: an append every few ms
    engine = uuid.uuid4().hex
    first = Running(broker, namespace, config, {"id": engine, "who": "the first sequencer"})
    client = Client(broker, namespace)
    try:

        def feed() -> None:  # 500 a second for 6 s: the takeover comes while requests still do
            for start in range(0, len(requests), 30):
                client.submit(requests[start : start + 30])
                time.sleep(0.06)

        feeder = threading.Thread(target=feed)
        feeder.start()
        while first.sequencer.stats.sequenced < 600:
            time.sleep(0.005)
        # A start that passed the look at the same moment (as the same engine, which the look lets
        # by): it takes the lane over from the live sequencer.
        second = Running(broker, namespace, config, {"id": engine, "who": "the second sequencer"})
        first.thread.join(30)
        feeder.join()
        assert isinstance(first.ended, Superseded), first.ended
        assert str(first.ended).startswith("the second sequencer started sequencing namespace"), first.ended
        counts, most_stale = accepted_log(broker, namespace, {r["id"] for r in requests})
        second.sequencer.stop()
        second.thread.join(30)
    finally:
        client.close()
    assert second.ended is None, second.ended
    assert set(counts) == {r["id"] for r in requests}
    assert max(counts.values()) == 1, [i for i, n in counts.items() if n > 1][:5]
    # Never more than one append ahead of its watch: at most two of its batches lie after the takeover.
    assert most_stale <= STALE_APPENDS


def test_a_sequencer_paused_through_a_takeover_appends_nothing_that_counts_and_stops(broker, namespace, tmp_path):
    """SIGSTOP the sequencer of `ordo sequence`, start another on its lane, let requests
    come, SIGCONT the first: whatever it appends before it reads the newer start record is
    dropped by every reader, and it stops in one line naming the takeover."""
    ensure_topics(broker, namespace)
    kafka = ("--bootstrap-servers", broker, "--namespace", namespace, "--procedures", "ordo.procedures.workloads.sl")
    requests = list(sl.generate(400, seed=22))
    first = ordo("sequence", *kafka, "--max-delay-ms", "0", stderr=subprocess.PIPE, text=True)
    second = None
    client = Client(broker, namespace)
    try:
        assert "resumes at batch" in first.stderr.readline()
        client.submit(requests[:100])
        counts, _ = accepted_log(broker, namespace, {r["id"] for r in requests[:100]})
        assert set(counts) == {r["id"] for r in requests[:100]}
        os.kill(first.pid, signal.SIGSTOP)
        client.submit(requests[100:200])  # waiting in the requests topic for whichever sequencer
        second = ordo("sequence", *kafka, stderr=subprocess.PIPE, text=True)
        assert "resumes at batch" in second.stderr.readline()
        client.submit(requests[200:300])
        os.kill(first.pid, signal.SIGCONT)
        client.submit(requests[300:])
        _, said = first.communicate(timeout=60)
        counts, most_stale = accepted_log(broker, namespace, {r["id"] for r in requests})
    finally:
        client.close()
        if second is not None:
            stop(second)
        stop(first)
    assert first.returncode != 0
    last = said.strip().splitlines()[-1]
    assert "Traceback" not in said and "fenced this one, which stops" in last, said
    assert set(counts) == {r["id"] for r in requests}
    assert max(counts.values()) == 1
    assert most_stale <= STALE_APPENDS


def test_a_log_the_previous_release_appended_in_transactions_is_continued(broker, namespace, tmp_path):
    """A log as a release that appended in Kafka transactions left it: each record in a
    transaction of the lane's transactional id (so commit markers between the records), and
    a batch whose first append was aborted and then appended again (its aborted copy in the
    log). `ordo run` continues it: its readers take the committed records only, its
    sequencer resumes after the last batch, and every request has one outcome."""
    from confluent_kafka import Producer

    from ordo.procedures.fingerprint import describe, set_id
    from ordo.broker.clients import kafka_config
    from ordo.log.records import encode_batch, encode_entry, encode_snapshot, encode_start
    from ordo.log.versions import transactional_id
    from tests.helpers import dump_state, read_results

    ensure_topics(broker, namespace)
    described = describe(load_registry(()))  # what `ordo run` sequences with by default
    requests = [
        {"id": f"d{i}", "proc": "sl_deposit", "args": {"account": i % 5, "asset": i % 3, "account_amount": i + 1, "asset_amount": 1}}
        for i in range(8)
    ]  # fmt: skip
    with Client(broker, namespace) as client:
        client.submit(requests[:4])
    log_topic = Topics(namespace).log
    producer = Producer(kafka_config(broker, {"transactional.id": transactional_id(namespace, 0)}))
    producer.init_transactions(30)

    def append(record: bytes, commit: bool = True) -> None:
        producer.begin_transaction()
        producer.produce(log_topic, record, partition=0)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)

    token = uuid.uuid4().hex
    append(encode_start(namespace, None, token, described))
    snapshot = {"next_batch": 1, "generation": 1, "next_offset": 1, "request_offsets": {}, "log_id": token}
    append(encode_snapshot(namespace, {**snapshot, "lanes": {0: [0, 1]}}, 0, 0))

    def batch(epoch: int, first: int, end: int) -> bytes:
        entries = [encode_entry([r["id"], r["proc"], r["args"]]) for r in requests[first:end]]
        return encode_batch(
            epoch, 0, int(time.time() * 1000), {0: (first, end)}, entries, None, token, 0, None,
            set_id(described), namespace=namespace,
        )  # fmt: skip

    append(batch(1, 0, 2))
    append(batch(2, 2, 4), commit=False)  # an append that failed, then went again
    append(batch(2, 2, 4))
    producer.flush(10)
    engine = ordo(
        "run", "--bootstrap-servers", broker, "--namespace", namespace, "--data-dir", str(tmp_path / "d"),
        "--runtime", "local", "--quiet", stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with Client(broker, namespace) as client:
            client.submit(requests[4:])
        records = read_results(broker, f"{namespace}.results", len(requests), timeout=120)
    finally:
        code = stop(engine)
        said = engine.stderr.read()
    assert code == 0, said
    assert sorted(r["id"] for r in records) == sorted(r["id"] for r in requests)  # each once
    assert all(r["status"] == "committed" for r in records), records
    counts, _ = accepted_log(broker, namespace, {r["id"] for r in requests})
    assert max(counts.values()) == 1
    deposited = sum(r["args"]["account_amount"] for r in requests)
    assert sum(v for (table, _), v in dump_state(str(tmp_path / "d")).items() if table == "account") == deposited
