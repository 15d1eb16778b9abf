"""An engine behind the log executes the batches waiting for it as rounds
(scheduler/round.py): on Kafka, with checkpoints on, what it publishes and the state it
leaves are those of one batch at a time and of the serial reading."""

import os

import pytest

from ordo.recovery.checkpoints import CheckpointStore
from ordo.scheduler.coordinator import Coordinator
from ordo.scheduler.outputs import CollectedOutputs
from ordo.state import digest
from tests.helpers import assert_same_as_reference, mixed_log, run_engine

pytestmark = pytest.mark.slow

PARTITIONS = 2
CHECKPOINT_EVERY = 25


@pytest.fixture(scope="module")
def small_batches(broker):
    """Multi-partition micro and sl traffic in batches of at most 8: about 250 batches
    that an engine started afterwards finds all waiting."""
    namespace = f"rounds-{os.getpid()}"
    last_batch, reference = mixed_log(broker, namespace, 1000, 7, PARTITIONS, 8, theta=0.9)
    assert last_batch > 200
    return namespace, last_batch, reference


@pytest.mark.parametrize("scheduler", ["vll", "opchain"])
def test_a_lagging_engine_runs_waiting_batches_in_rounds_with_one_batch_at_a_time_s_outputs(
    broker, small_batches, tmp_path, scheduler
):
    namespace, last_batch, reference = small_batches
    outputs = CollectedOutputs()
    coordinator = Coordinator(
        broker,
        namespace,
        str(tmp_path / "rounds"),
        scheduler,
        PARTITIONS,
        runtime="local",
        outputs=outputs,
        checkpoint_every=CHECKPOINT_EVERY,
        keep_checkpoints=100,
    )
    coordinator.run(until_batch=last_batch)
    assert_same_as_reference(outputs, digest(str(tmp_path / "rounds")), last_batch, reference)
    executions = sum(s["rounds"] for s in coordinator.statuses)
    assert 0 < executions < PARTITIONS * last_batch / 4, (executions, last_batch)
    # Rounds end at checkpoints: every one was taken, at its batch on every shard.
    taken = [entry["batch"] for entry in CheckpointStore(str(tmp_path / "rounds"), PARTITIONS).entries()]
    assert taken == list(range(CHECKPOINT_EVERY, last_batch + 1, CHECKPOINT_EVERY)), taken

    one_by_one, state = run_engine(broker, namespace, last_batch, tmp_path / "one", scheduler, PARTITIONS, round_txns=0)
    assert_same_as_reference(one_by_one, state, last_batch, reference)
    assert state == digest(str(tmp_path / "rounds"))
