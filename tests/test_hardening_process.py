"""An `ordo run` killed with SIGKILL takes its sequencer child with it: no orphan goes on
sequencing for an engine that is gone."""

from __future__ import annotations

import signal
import subprocess
import time

import psutil
import pytest

from ordo.broker.topics import ensure_topics
from tests.helpers import ordo, stop

pytestmark = pytest.mark.slow


def sequencer_child(engine: subprocess.Popen, other_than: int | None = None, timeout: float = 60) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert engine.poll() is None, "ordo run exited"
        for child in psutil.Process(engine.pid).children():
            try:
                if "sequence" in child.cmdline() and child.pid != other_than:
                    return child
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.1)
    raise AssertionError("ordo run started no sequencer")


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("restarted", [False, True])
def test_sigkill_of_ordo_run_ends_its_sequencer(broker, namespace, tmp_path, restarted):
    ensure_topics(broker, namespace)
    engine = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path / "d"),
        "--quiet",
        "--runtime",
        "local",
    )
    children = []
    try:
        children.append(sequencer_child(engine))
        if restarted:
            # A restarted sequencer is started by the engine's supervisor thread, not its
            # main thread: it must be tied to the engine all the same.
            time.sleep(2)
            children[0].kill()
            children.append(sequencer_child(engine, other_than=children[0].pid))
        time.sleep(3)  # past the sequencer's start: it is sequencing, not starting up
        assert children[-1].is_running() and children[-1].status() != psutil.STATUS_ZOMBIE
        engine.send_signal(signal.SIGKILL)
        engine.wait(10)
        _, alive = psutil.wait_procs(children, timeout=5)
        alive = [p for p in alive if _running(p)]  # a dead child nobody has reaped yet is gone
        assert not alive, f"sequencer {alive} outlived its engine"
    finally:
        for child in children:
            if _running(child):
                child.kill()
        stop(engine)
