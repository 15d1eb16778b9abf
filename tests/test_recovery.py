"""Checkpoints and restore, step by step: what a checkpoint holds, which shards are
restored from it, that a checkpoint cut short is never used, rebuilding from scratch,
and the errors a user sees when recovery is impossible."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer

from ordo.state import digest
from ordo.recovery.checkpoints import MANIFEST, CheckpointStore, checkpoint_name
from ordo.recovery.checks import applied_markers, check_applied_once
from ordo.recover import recover
from ordo.recovery.restore import RecoveryError
from ordo.scheduler.coordinator import Coordinator
from ordo.scheduler.outputs import CollectedOutputs
from ordo.broker.clients import kafka_config
from ordo.log.records import LogCursor, encode_batch, encode_entry, encode_start
from ordo.broker.topics import ensure_topics
from ordo.storage.rocks import RocksShard
from tests.helpers import ROOT, assert_same_as_reference, mixed_log, ordo, run_engine, stop

pytestmark = pytest.mark.slow

PARTITIONS = 2


@pytest.fixture(autouse=True)
def trace_applied(monkeypatch):
    monkeypatch.setenv("ORDO_TRACE_APPLIED", "1")


@pytest.fixture(scope="module")
def shared_log(broker):
    """Multi-partition micro and sl traffic with aborts, in about 60 batches."""
    namespace = f"recovery-{os.getpid()}"
    last_batch, reference = mixed_log(broker, namespace, 1000, 31, PARTITIONS, 33, theta=0.9)
    assert last_batch > 50
    return namespace, last_batch, reference


def engine(broker, namespace, data_dir, until_batch, scheduler="serial", **options):
    """Run the engine in this process through `until_batch`; return its outputs."""
    outputs = CollectedOutputs()
    coordinator = Coordinator(
        broker, namespace, str(data_dir), scheduler, PARTITIONS, runtime="local", outputs=outputs, **options
    )
    coordinator.run(until_batch=until_batch)
    return outputs, coordinator


def outputs_after(reference, batch):
    """The reference outcomes and change data of the batches after `batch`."""
    return ([o for o in reference.outcomes if o["batch"] > batch], [c for c in reference.changes if c[0] > batch])


def test_checkpoints_hold_their_batch_and_old_ones_are_pruned(broker, shared_log, tmp_path):
    namespace, last_batch, reference = shared_log
    outputs, coordinator = engine(broker, namespace, tmp_path, last_batch, checkpoint_every=10, keep_checkpoints=3)
    assert coordinator.recovery.action == "fresh"
    assert_same_as_reference(outputs, digest(str(tmp_path)), last_batch, reference)
    assert coordinator.stats.checkpoints == last_batch // 10
    store = CheckpointStore(str(tmp_path), PARTITIONS)
    expected = [b for b in range(10, last_batch + 1, 10)][-3:]
    assert [e["batch"] for e in store.entries()] == expected
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [checkpoint_name(b) for b in expected]
    for entry in store.entries():
        for path in store.shard_dirs(entry):
            with RocksShard(path, read_only=True) as shard:
                marker = shard.applied()
            assert marker["batch"] == entry["batch"]
            assert LogCursor.from_dict(marker["cursor"], namespace) == LogCursor.from_dict(entry["cursor"], namespace)
    check_applied_once(str(tmp_path), last_batch)


def test_shards_that_disagree_are_restored_from_the_newest_checkpoint(broker, shared_log, tmp_path):
    namespace, last_batch, reference = shared_log
    data_dir = tmp_path / "d"
    engine(broker, namespace, data_dir, 20, checkpoint_every=10)
    shutil.copytree(data_dir / "shard-1", tmp_path / "shard-1-at-20")
    engine(broker, namespace, data_dir, 35, checkpoint_every=10)
    # As if shard 1's commits of batches 21..35 never landed: shard 0 at 35, shard 1 at 20.
    shutil.rmtree(data_dir / "shard-1")
    shutil.copytree(tmp_path / "shard-1-at-20", data_dir / "shard-1")
    assert [m["batch"] for m in applied_markers(str(data_dir))] == [35, 20]

    outputs, coordinator = engine(broker, namespace, data_dir, last_batch, scheduler="locking", checkpoint_every=10)
    plan = coordinator.recovery
    assert (plan.action, plan.checkpoint["batch"]) == ("restore", 30)
    assert "shards stopped at different batches 0: 35, 1: 20" in plan.reason
    # Batches 31..35 are executed again and their outputs re-emitted exactly as before.
    assert (outputs.outcomes, outputs.changes) == outputs_after(reference, 30)
    assert digest(str(data_dir)) == (reference.digest(), last_batch)
    check_applied_once(str(data_dir), last_batch)


@pytest.mark.parametrize("damage", ["missing", "unreadable"])
def test_a_missing_or_unreadable_shard_is_restored(broker, shared_log, tmp_path, damage):
    namespace, last_batch, reference = shared_log
    engine(broker, namespace, tmp_path, 25, checkpoint_every=10)
    if damage == "missing":
        shutil.rmtree(tmp_path / "shard-0")
    else:
        (tmp_path / "shard-0" / "CURRENT").write_text("MANIFEST-999999\n")
    outputs, coordinator = engine(broker, namespace, tmp_path, last_batch, checkpoint_every=10)
    assert coordinator.recovery.action == "restore" and coordinator.recovery.checkpoint["batch"] == 20
    assert f"shard 0 is {damage}" in coordinator.recovery.reason
    assert (outputs.outcomes, outputs.changes) == outputs_after(reference, 20)
    assert digest(str(tmp_path)) == (reference.digest(), last_batch)
    check_applied_once(str(tmp_path), last_batch)


def test_without_a_checkpoint_disagreeing_shards_are_rebuilt_from_the_log(broker, shared_log, tmp_path):
    namespace, last_batch, reference = shared_log
    engine(broker, namespace, tmp_path, 25, checkpoint_every=0)
    shutil.rmtree(tmp_path / "shard-1")
    outputs, coordinator = engine(broker, namespace, tmp_path, last_batch, checkpoint_every=0)
    assert coordinator.recovery.action == "rebuild"
    assert_same_as_reference(outputs, digest(str(tmp_path)), last_batch, reference)
    check_applied_once(str(tmp_path), last_batch)


def test_the_replay_rate_counts_only_applied_transactions(broker, shared_log, tmp_path):
    """Batches execute up to a pipeline ahead of their apply: a rate timed by applied
    batches must count the transactions of applied batches, or a short replay whose
    every batch executed before the first apply was seen reports zero."""
    namespace, last_batch, reference = shared_log
    through = [0] * (last_batch + 1)
    for outcome in reference.outcomes:
        through[outcome["batch"]] += 1
    for batch in range(1, last_batch + 1):
        through[batch] += through[batch - 1]
    # Outputs go to Kafka, where acknowledgements lag, so execution runs ahead of apply.
    coordinator = Coordinator(broker, namespace, str(tmp_path), "vll", PARTITIONS, runtime="local")
    seen = []

    def check(stats):
        newest = max(s["applied"] for s in coordinator.statuses)
        assert through[stats.last_batch] <= stats.applied_txns <= through[newest]
        seen.append(stats.applied_txns)

    stats = coordinator.run(until_batch=last_batch, progress=check)
    assert seen and seen == sorted(seen)
    assert stats.applied_txns == stats.txns == len(reference.outcomes)

    report = recover(
        broker,
        namespace,
        str(tmp_path / "again"),
        "vll",
        PARTITIONS,
        mode="scratch",
        idle=1.0,
        quiet=True,
        runtime="local",
    )
    assert report.to_batch == last_batch and report.txns == len(reference.outcomes)
    assert 0 <= report.steady_txns <= report.txns
    assert report.steady_txns_per_s > 0


def test_rebuild_from_scratch_under_another_scheduler_gives_the_same_digest(broker, shared_log, tmp_path):
    namespace, last_batch, reference = shared_log
    data_dir = str(tmp_path / "d")
    run_engine(broker, namespace, last_batch, data_dir, "serial", PARTITIONS)
    original = digest(data_dir)
    done = ordo_run(
        "recover",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--scheduler",
        "opchain",
        "--from-scratch",
        "--idle",
        "1",
        "--checkpoint",
    )
    assert done.returncode == 0, done.stderr
    # --runtime auto: two partitions, yet no Ray, which nothing here asks for
    assert f"({PARTITIONS} partition worker(s) in this process)" in done.stderr, done.stderr
    assert "wiped the shards to rebuild them from the beginning of the log" in done.stderr
    assert f"replay of {last_batch} batches" in done.stderr and "txns/s" in done.stderr
    assert digest(data_dir) == original == (reference.digest(), last_batch)
    assert [e["batch"] for e in CheckpointStore(data_dir, PARTITIONS).entries()] == [last_batch]
    check_applied_once(data_dir, last_batch)


def test_a_checkpoint_cut_short_is_never_used_and_is_cleaned(broker, shared_log, tmp_path):
    namespace, last_batch, reference = shared_log
    engine(broker, namespace, tmp_path, 25, checkpoint_every=10)
    store = CheckpointStore(str(tmp_path), PARTITIONS)
    manifest_before = (tmp_path / MANIFEST).read_text()

    # A crash while checkpointing batch 24: one shard's checkpoint written, the other not,
    # the manifest never rewritten. It is newer than every listed checkpoint.
    class CrashMidway:
        partitions = PARTITIONS

        def checkpoint(self, paths):
            shutil.copytree(tmp_path / "shard-0", paths[0])
            raise KeyboardInterrupt("killed")

    with pytest.raises(KeyboardInterrupt):
        store.take(CrashMidway(), {"batch": 24, "cursor": {}})
    (tmp_path / f"{MANIFEST}.tmp").write_text('{"checkpoints": [{"batch": 24')  # a manifest write cut short
    assert (tmp_path / MANIFEST).read_text() == manifest_before
    assert store.latest()["batch"] == 20
    assert os.path.isdir(tmp_path / "checkpoints" / checkpoint_name(24))

    outputs, coordinator = engine(broker, namespace, tmp_path, last_batch, checkpoint_every=0, restore="checkpoint")
    assert coordinator.recovery.checkpoint["batch"] == 20
    assert {os.path.basename(p) for p in coordinator.recovery.cleaned} == {f"{MANIFEST}.tmp", checkpoint_name(24)}
    assert not os.path.exists(tmp_path / "checkpoints" / checkpoint_name(24))
    assert (outputs.outcomes, outputs.changes) == outputs_after(reference, 20)
    assert digest(str(tmp_path)) == (reference.digest(), last_batch)


def test_from_checkpoint_without_one_and_a_second_engine_are_refused(broker, shared_log, tmp_path):
    namespace, _, _ = shared_log
    with pytest.raises(RecoveryError, match="no complete checkpoint"):
        Coordinator(broker, namespace, str(tmp_path), "serial", PARTITIONS, runtime="local", restore="checkpoint")
    first = Coordinator(broker, namespace, str(tmp_path), "serial", PARTITIONS, runtime="local")
    try:
        with pytest.raises(RecoveryError, match="another engine"):
            Coordinator(broker, namespace, str(tmp_path), "serial", PARTITIONS, runtime="local")
    finally:
        first.close()


def test_a_log_that_lost_batches_stops_recovery_with_the_missing_batch(broker, namespace, tmp_path):
    ensure_topics(broker, namespace)
    producer = Producer(kafka_config(broker))
    producer.produce(f"{namespace}.log", encode_start(namespace, None, "s1"))
    for batch_id in (4, 5):  # batches 1..3 gone, as if the log had been truncated
        entry = encode_entry([f"r{batch_id}", "micro_rmw", {"keys": [batch_id]}])
        producer.produce(
            f"{namespace}.log", encode_batch(batch_id, 0, 0, {}, [entry], log_id="s1", namespace=namespace)
        )
    producer.flush(10)
    done = ordo_run(
        "recover", "--bootstrap-servers", broker, "--namespace", namespace, "--data-dir", str(tmp_path), "--idle", "5"
    )
    assert done.returncode == 2
    assert (
        f"ordo recover: cannot replay {namespace}.log from batch 1: log gap: expected batch 1 of sequencer 0, found batch 4"
        in done.stderr
    ), done.stderr
    assert "Traceback" not in done.stderr


def test_sigusr1_checkpoints_a_running_engine(broker, shared_log, tmp_path):
    namespace, last_batch, reference = shared_log
    data_dir = str(tmp_path)
    process = ordo(
        "execute",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--partitions",
        str(PARTITIONS),
        "--runtime",
        "local",
        "--checkpoint-every",
        "0",
        "--quiet",
    )
    try:
        wait_until(lambda: [(m or {}).get("batch") for m in applied_markers(data_dir)] == [last_batch] * PARTITIONS)
        assert CheckpointStore(data_dir, PARTITIONS).latest() is None
        process.send_signal(signal.SIGUSR1)  # the engine is past start-up: its handler is installed
        wait_until(lambda: CheckpointStore(data_dir, PARTITIONS).latest() is not None)
    finally:
        assert stop(process) == 0
    assert CheckpointStore(data_dir, PARTITIONS).latest()["batch"] == last_batch
    assert digest(data_dir) == (reference.digest(), last_batch)


def wait_until(condition, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (FileNotFoundError, OSError, Exception):  # shards not created yet
            pass
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def ordo_run(*args, timeout=120):
    """The CLI to its end, with its stderr (tests.helpers.ordo_output wants success)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run(
        [sys.executable, "-m", "ordo.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_a_replay_applied_before_its_first_look_shows_no_made_up_rate(broker, namespace, tmp_path):
    import io

    from ordo.recover import ReplayProgress, per_second
    from ordo.scheduler.coordinator import EngineStats

    ensure_topics(broker, namespace)
    coordinator = Coordinator(broker, namespace, str(tmp_path / "d"), "serial", 1)
    try:
        stream = io.StringIO()
        progress = ReplayProgress(coordinator, idle=2.0, checkpoint_at_end=False, stream=stream)
        progress._show(EngineStats(batches=100, txns=20_000, last_batch=100), progress.started)
    finally:
        coordinator.stop()
        coordinator.run()
    line = stream.getvalue()
    assert "100 batches (too fast to time) | 20,000 txns (too fast to time)" in line, line
    assert per_second(20_000, 2.0, "txns") == "10,000 txns/s"
