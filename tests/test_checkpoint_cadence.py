"""Which batches are checkpointed (recovery/cadence.py): every K batches, or each T
seconds of log time, decided from the log alone, so every partition, every restart and
every replay checkpoints the same batches."""

import argparse
import os

import pytest
from confluent_kafka import Producer

from ordo.broker.clients import kafka_config
from ordo.broker.topics import ensure_topics
from ordo.log.records import encode_batch, encode_entry, encode_start
from ordo.recovery.cadence import Cadence, cadence, checkpoint_every
from ordo.recovery.checkpoints import CheckpointStore
from ordo.scheduler.coordinator import Coordinator
from ordo.scheduler.outputs import CollectedOutputs
from ordo.state import digest

PARTITIONS = 2
BATCHES = 30
T0 = 1_800_000_000_000  # a whole second, in ms
STEP_MS = 400  # the log's time between two batches


@pytest.mark.parametrize(
    "given, expected",
    [
        (100, Cadence(batches=100)),
        ("100", Cadence(batches=100)),
        ("0", Cadence()),
        (0, Cadence()),
        ("10s", Cadence(seconds=10)),
        (" 2.5s ", Cadence(seconds=2.5)),
    ],
)
def test_a_cadence_is_batches_or_seconds_of_log_time(given, expected):
    assert cadence(given) == expected
    assert cadence(given).enabled == (expected != Cadence())


@pytest.mark.parametrize("given", ["5x", "-1", "0s", "s", "10 ms", ""])
def test_a_cadence_that_means_nothing_is_refused_in_one_line(given):
    with pytest.raises(argparse.ArgumentTypeError, match="no checkpoint cadence"):
        checkpoint_every(given)


def test_the_option_keeps_a_count_an_integer():
    assert checkpoint_every("7") == 7 and checkpoint_every("10s") == "10s"


def test_a_batch_is_due_where_the_log_time_enters_another_slot():
    by_time = Cadence(seconds=1)
    assert by_time.due(7, 2_000, 1_999) and by_time.due(7, 3_500, 1_000)
    assert not by_time.due(7, 1_999, 1_000) and not by_time.due(7, 2_000, 2_000)
    assert not by_time.due(1, 2_000, 0)  # the first batch of a log: nothing to keep yet
    assert by_time.due(7, 1_000, 2_000)  # a clock that went back moves the slot too
    by_count = Cadence(batches=10)
    assert by_count.due(20, 0, 0) and not by_count.due(21, 5_000, 1_000)
    assert not Cadence().due(10, 5_000, 1_000)


def expected_checkpoints(first: int, last: int) -> list[int]:
    """The batches a 1 s cadence checkpoints among `first`..`last`, by the rule's own terms
    (none before the first batch)."""
    time = lambda b: T0 + STEP_MS * b  # noqa: E731
    return [b for b in range(max(first, 2), last + 1) if time(b) // 1000 != time(b - 1) // 1000]


@pytest.fixture(scope="module")
def timed_log(broker):
    """BATCHES batches STEP_MS apart in log time, each with a transaction on both partitions."""
    namespace = f"cadence-{os.getpid()}"
    ensure_topics(broker, namespace)
    producer = Producer(kafka_config(broker))
    producer.produce(f"{namespace}.log", encode_start(namespace, None, "s1"))
    for batch_id in range(1, BATCHES + 1):
        entries = [encode_entry([f"r{batch_id}.{i}", "micro_rmw", {"keys": [batch_id + i, i]}]) for i in range(3)]
        record = encode_batch(batch_id, 0, T0 + STEP_MS * batch_id, {}, entries, log_id="s1", namespace=namespace)
        producer.produce(f"{namespace}.log", record)
    assert producer.flush(10) == 0
    return namespace


def run(broker, namespace, data_dir, until_batch, every):
    outputs = CollectedOutputs()
    coordinator = Coordinator(
        broker,
        namespace,
        str(data_dir),
        "vll",
        PARTITIONS,
        runtime="local",
        outputs=outputs,
        checkpoint_every=every,
        keep_checkpoints=BATCHES,
    )
    coordinator.run(until_batch=until_batch)
    return outputs


def checkpointed(data_dir) -> list[int]:
    return [entry["batch"] for entry in CheckpointStore(str(data_dir), PARTITIONS).entries()]


def test_seconds_of_log_time_checkpoint_the_same_batches_on_every_partition_and_after_a_restart(
    broker, timed_log, tmp_path
):
    namespace = timed_log
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    once = run(broker, namespace, whole, BATCHES, "1s")
    assert checkpointed(whole) == expected_checkpoints(1, BATCHES)

    # Stopped at batch 12 and started again: the restart knows batch 12's time from the
    # log cursor in the shards' markers, so batch 13, the first of a new second, is due
    # as in the run that never stopped.
    assert expected_checkpoints(12, 13) == [13]
    first = run(broker, namespace, halves, 12, "1s")
    assert checkpointed(halves) == expected_checkpoints(1, 12)
    second = run(broker, namespace, halves, BATCHES, "1s")
    assert checkpointed(halves) == checkpointed(whole)
    assert (first.outcomes + second.outcomes, first.changes + second.changes) == (once.outcomes, once.changes)
    assert digest(str(halves)) == digest(str(whole))


def test_a_count_of_batches_checkpoints_its_multiples(broker, timed_log, tmp_path):
    run(broker, timed_log, tmp_path, BATCHES, 7)
    assert checkpointed(tmp_path) == [7, 14, 21, 28]
