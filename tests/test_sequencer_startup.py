"""A restarting sequencer reads the log from a recent snapshot of its predecessor's state,
not from the head: start-up costs what the duplicate check needs, however long the log.
The log topic is made to keep every record, and a log that would not is refused."""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from ordo.client import Client
from ordo.embedded import SequencerThread, read_log
from ordo.procedures.ollp import request_identity
from ordo.procedures.registry import default_registry
from ordo.broker.clients import kafka_config
from ordo.log.records import SNAPSHOT_EVERY
from ordo.sequencer.sequencer import Sequencer, SequencerConfig
from ordo.broker.topics import Topics, check_topics, ensure_topics

pytestmark = pytest.mark.slow

WINDOW = 40


def deposits(start: int, count: int, repeat_every: int = 0) -> list[dict]:
    return [
        {
            "id": f"r{i - 1 if repeat_every and i % repeat_every == 0 else i}",
            "proc": "sl_deposit",
            "args": {"account": i % 5, "asset": 0, "account_amount": 1, "asset_amount": 1},
        }
        for i in range(start, start + count)
    ]


def test_a_restarted_sequencer_reads_back_only_to_a_snapshot_and_remembers_the_same_ids(broker, namespace):
    ensure_topics(broker, namespace)
    config = SequencerConfig(max_txns=2, dedupe_window=WINDOW)
    requests = deposits(0, 2 * (3 * SNAPSHOT_EVERY + 17), repeat_every=7)  # some duplicates, rejected
    client = Client(broker, namespace)
    client.submit(requests)

    first = SequencerThread(broker, namespace, config).start()
    first.wait_for(len(requests))
    last_batch = first.sequencer.next_batch - 1
    first.stop()
    assert last_batch > 3 * SNAPSHOT_EVERY

    restarted = Sequencer(broker, namespace, default_registry(), config)
    try:
        restarted.start()
        assert restarted.next_batch == last_batch + 1 and restarted.generation == 2
        log_records = 2 * last_batch  # at least: every batch and its transaction marker
        assert restarted.stats.startup_records < 2 * SNAPSHOT_EVERY + 2 * WINDOW + 20 < log_records / 2
        accepted = [
            request_identity(request_id, args)
            for batch in read_log(broker, namespace, last_batch)
            for request_id, proc, args in batch.entries
            if proc is not None
        ]
        assert set(restarted._recent._order) >= set(accepted[-WINDOW:])
        remembered = [i for i in accepted if i in restarted._recent]
        assert remembered[-WINDOW:] == accepted[-WINDOW:]
    finally:
        restarted.close()

    # It goes on where the first left off: a recent id is still a duplicate.
    client.submit([{**deposits(0, 1)[0], "id": requests[-1]["id"]}, *deposits(10_000, 3)])

    client.close()
    again = SequencerThread(broker, namespace, config).start()
    again.wait_for(4)
    final = again.sequencer.next_batch - 1
    again.stop()
    tail = [entry for batch in read_log(broker, namespace, final)[last_batch:] for entry in batch.entries]
    assert [proc is None for _, proc, _ in tail] == [True, False, False, False]
    assert "duplicate request id" in tail[0][2]


def test_the_log_topic_keeps_every_record_and_a_log_that_would_not_is_refused(broker, namespace):
    ensure_topics(broker, namespace, replication=1)
    admin = AdminClient(kafka_config(broker))
    (future,) = admin.describe_configs([ConfigResource("topic", Topics(namespace).log)]).values()
    configs = future.result(10)
    assert configs["retention.ms"].value == "-1" and configs["retention.bytes"].value == "-1"

    # One broker cannot hold three replicas: one line that says so (the three-node cluster's
    # log, with min.insync.replicas=2, is checked in tests/test_broker_faults.py).
    with pytest.raises(RuntimeError, match=r"with 3 replicas: the cluster has 1 broker\(s\); use --log-replication 1"):
        ensure_topics(broker, f"{namespace}-r3", replication=3)

    other = f"{namespace}-short"
    admin.create_topics([NewTopic(f"{other}.log", 1, 1, config={"retention.ms": "604800000"})])[f"{other}.log"].result(
        10
    )
    with pytest.raises(RuntimeError, match=r"retention.ms=604800000: the log is the source of truth"):
        ensure_topics(broker, other)


def test_a_sequencer_on_a_namespace_without_topics_says_so_and_exits(broker, namespace):
    with pytest.raises(RuntimeError, match=r"do not exist: create the namespace's topics first"):
        check_topics(broker, Topics(namespace))
    done = subprocess.run(
        [sys.executable, "-m", "ordo.cli", "sequence", "--bootstrap-servers", broker, "--namespace", namespace],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "do not exist" in done.stderr, done.stderr


def test_a_snapshot_is_out_of_place_after_a_record_that_closed_its_lane():
    """A snapshot describes the batch before it only while its lane is open: an upgrade
    record or a start record of another sequencer count between the two closed every lane,
    and a start record of its own lane began another generation."""
    from ordo.log.records import LogCursor, batch_head, decode, encode_batch, encode_entry, encode_snapshot
    from ordo.log.records import encode_start, encode_upgrade
    from ordo.log.snapshots import in_place

    ns = "ns"
    start = encode_start(ns, None, "L")  # the log's first record: its token names the log
    batch = encode_batch(1, 0, 5, {0: (0, 1)}, [encode_entry(["a", "p", {}])], log_id="L", namespace=ns)
    cursor = LogCursor(namespace=ns)
    cursor.accept(start, 0)
    cursor.accept(batch, 1)
    _, snapshot = decode(encode_snapshot(ns, cursor.to_dict(), 1, 5), ns, "L")
    earlier = [[0, start, None], [1, batch, batch_head(batch)]]
    assert in_place(snapshot, earlier, ns, "L")
    for closing in (
        encode_upgrade(ns, {}, 2, "L"),
        encode_start(ns, "L", "another count", None, 1, 2),
        encode_start(ns, "L", "a newer generation"),
    ):
        assert not in_place(snapshot, [*earlier, [2, closing, None]], ns, "L")
