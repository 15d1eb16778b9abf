"""`ordo recover` replays to the head of the log it measured when it started, whatever the
partition count: starting the workers (Ray's take seconds) never counts as the log being
quiet. A replay that cannot get there fails with one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ordo.procedures.workloads import micro
from ordo.storage.digest import to_hex
from tests.helpers import ROOT, run_engine, sequence_requests

pytestmark = pytest.mark.slow


def _ordo(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ordo.cli", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("partitions", [1, 2, 3])
def test_recover_replays_to_the_head_whatever_the_partition_count(broker, namespace, tmp_path, partitions):
    requests = list(micro.generate(800, seed=partitions, partitions=max(partitions, 2), keys=60, hot=3, mp=0.5))
    last_batch, reference = sequence_requests(broker, namespace, requests, max_txns=10, partitions=partitions)
    data_dir = str(tmp_path / "data")
    # The engine ran part of the log, then went away: recovery brings it to the head.
    run_engine(broker, namespace, last_batch // 4, data_dir, "serial", partitions, checkpoint_every=0)
    # No idle wait at all: the replay must still go on to the head it measured.
    done = _ordo(
        "recover",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--partitions",
        str(partitions),
        "--idle",
        "0",
        # `--runtime auto` keeps a replay's workers in its own process; Ray's start, which
        # must not count as a quiet log either, is asked for at 3 partitions.
        *(["--runtime", "ray"] if partitions == 3 else []),
    )
    assert done.returncode == 0, done.stderr
    assert ("as Ray actors" if partitions == 3 else "in this process") in done.stderr, done.stderr
    assert f"applied through batch {last_batch}" in done.stderr, done.stderr
    digest = _ordo("digest", "--data-dir", data_dir)
    assert digest.returncode == 0, digest.stderr
    assert digest.stdout.strip() == to_hex(reference.digest())
    assert f"applied through batch {last_batch}" in digest.stderr
