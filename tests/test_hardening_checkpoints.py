"""A broken checkpoint does not stop recovery: checkpoints are tried newest first, each
broken one is reported in one line and the next older one used; with none usable the
shards are rebuilt from the log, or, when a checkpoint was asked for, recovery stops
with the shards as they were."""

from __future__ import annotations

import glob
import os
import shutil

import pytest

from ordo.state import digest
from ordo.recovery.checkpoints import CheckpointStore
from ordo.recovery.checks import applied_markers, check_applied_once
from ordo.recovery.restore import CHECKPOINT, RecoveryError, prepare_shards
from ordo.scheduler.coordinator import Coordinator
from ordo.scheduler.outputs import CollectedOutputs
from tests.helpers import assert_same_as_reference, mixed_log

pytestmark = pytest.mark.slow

PARTITIONS = 2


@pytest.fixture(autouse=True)
def trace_applied(monkeypatch):
    monkeypatch.setenv("ORDO_TRACE_APPLIED", "1")


@pytest.fixture(scope="module")
def shared_log(broker):
    namespace = f"hardening-checkpoints-{os.getpid()}"
    last_batch, reference = mixed_log(broker, namespace, 400, 41, PARTITIONS, 25)
    assert last_batch > 30
    return namespace, last_batch, reference


def engine(broker, namespace, data_dir, until_batch, **options):
    outputs = CollectedOutputs()
    coordinator = Coordinator(
        broker,
        namespace,
        str(data_dir),
        "serial",
        PARTITIONS,
        runtime="local",
        outputs=outputs,
        checkpoint_every=10,
        **options,
    )
    coordinator.run(until_batch=until_batch)
    return outputs, coordinator


def outputs_after(reference, batch):
    return ([o for o in reference.outcomes if o["batch"] > batch], [c for c in reference.changes if c[0] > batch])


def checkpoint_shard(data_dir, batch: int, partition: int) -> str:
    store = CheckpointStore(str(data_dir), PARTITIONS)
    [entry] = [e for e in store.entries() if e["batch"] == batch]
    return store.shard_dirs(entry)[partition]


def own_sst(data_dir, batch: int, partition: int) -> str:
    """An SST file of one checkpoint that no older checkpoint links (SST files are
    hard-linked, so damaging a shared one would damage the older checkpoint too)."""
    older = {os.stat(f).st_ino for f in glob.glob(os.path.join(checkpoint_shard(data_dir, 10, partition), "*.sst"))}
    mine = [
        f
        for f in glob.glob(os.path.join(checkpoint_shard(data_dir, batch, partition), "*.sst"))
        if os.stat(f).st_ino not in older
    ]
    assert mine, "the newer checkpoint holds no file of its own"
    return max(mine, key=os.path.getsize)


def damage(data_dir, batch: int, how: str) -> None:
    shard = checkpoint_shard(data_dir, batch, 0)
    if how == "missing sst":
        os.remove(sorted(glob.glob(os.path.join(shard, "*.sst")))[-1])
    elif how == "corrupt sst":
        sst = own_sst(data_dir, batch, 0)
        size = os.path.getsize(sst)
        with open(sst, "r+b") as f:  # the shared inode: the live shard 0 is damaged too
            f.seek(size // 2)
            f.write(b"\xa5" * 64)
    elif how == "corrupt manifest":
        [manifest] = glob.glob(os.path.join(shard, "MANIFEST-*"))
        with open(manifest, "r+b") as f:
            f.seek(20)
            f.write(b"\xa5" * 32)
    elif how == "missing shard":
        shutil.rmtree(os.path.dirname(shard))


@pytest.mark.parametrize("how", ["missing sst", "corrupt sst", "corrupt manifest", "missing shard"])
def test_a_broken_newest_checkpoint_falls_back_to_the_older_one(broker, shared_log, tmp_path, capsys, how):
    namespace, last_batch, reference = shared_log
    engine(broker, namespace, tmp_path, 25)
    assert [e["batch"] for e in CheckpointStore(str(tmp_path), PARTITIONS).entries()] == [10, 20]
    damage(tmp_path, 20, how)
    shutil.rmtree(tmp_path / "shard-1")  # shards that need a restore
    capsys.readouterr()

    outputs, coordinator = engine(broker, namespace, tmp_path, last_batch)
    plan = coordinator.recovery
    assert (plan.action, plan.checkpoint["batch"]) == ("restore", 10)
    assert "skipped 1 unusable newer checkpoint" in plan.reason
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("checkpoint of batch 20 is unusable (") and line.endswith("; trying the one of batch 10")
    assert (outputs.outcomes, outputs.changes) == outputs_after(reference, 10)
    assert digest(str(tmp_path)) == (reference.digest(), last_batch)
    check_applied_once(str(tmp_path), last_batch)


def test_with_every_checkpoint_broken_the_shards_are_rebuilt_from_the_log(broker, shared_log, tmp_path, capsys):
    namespace, last_batch, reference = shared_log
    engine(broker, namespace, tmp_path, 25)
    for batch in (20, 10):
        damage(tmp_path, batch, "missing sst")
    shutil.rmtree(tmp_path / "shard-1")
    capsys.readouterr()

    outputs, coordinator = engine(broker, namespace, tmp_path, last_batch)
    plan = coordinator.recovery
    assert plan.action == "rebuild" and "no usable checkpoint" in plan.reason
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("checkpoint of batch 20 is unusable") and lines[0].endswith("trying the one of batch 10")
    assert lines[1].startswith("checkpoint of batch 10 is unusable") and lines[1].endswith("no older checkpoint")
    assert_same_as_reference(outputs, digest(str(tmp_path)), last_batch, reference)


def test_asked_for_a_checkpoint_with_none_usable_recovery_stops_and_keeps_the_shards(broker, shared_log, tmp_path):
    namespace, _, _ = shared_log
    engine(broker, namespace, tmp_path, 25)
    for batch in (20, 10):
        damage(tmp_path, batch, "corrupt manifest")
    before = applied_markers(str(tmp_path))
    store = CheckpointStore(str(tmp_path), PARTITIONS)
    with pytest.raises(RecoveryError, match="no usable checkpoint .*batch 20: shard 0 is corrupt.*--from-scratch"):
        prepare_shards(str(tmp_path), PARTITIONS, store, CHECKPOINT)
    assert applied_markers(str(tmp_path)) == before == [{"batch": 25, "cursor": before[0]["cursor"]}] * 2
    assert not glob.glob(str(tmp_path / "*.restoring"))
