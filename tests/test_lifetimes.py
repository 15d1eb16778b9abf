"""Nothing outlives its owner: the servers a test run, a benchmark or `ordo bench` starts
(Apache Kafka, Ray, the PostgreSQL baseline) stop when the process that started them is
stopped by SIGTERM or SIGKILL, which no handler of its own sees. An owner holding one of
each is killed midway; what is left of it is listed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from ordo.benchmarks.baseline import BaselineUnavailable, find_bindir
from tests.helpers import ROOT

pytestmark = pytest.mark.slow

# As a test session holds them (tests/conftest.py): a broker, Ray, the PostgreSQL baseline,
# and `ordo run` on two partitions, which has a sequencer and a Ray of its own.
OWNER = textwrap.dedent("""
    import os, subprocess, sys, time
    from ordo.lifeline import stop_descendants_with_owner
    stop_descendants_with_owner()
    from ordo.benchmarks.baseline import PostgresServer
    from ordo.client import Client
    from ordo.scheduler.ray_group import start_ray
    from ordo.broker.local import local_broker

    broker = local_broker()
    broker.start()
    engine = subprocess.Popen([sys.executable, "-m", "ordo.cli", "run", "--bootstrap-servers",
                               broker.bootstrap_servers, "--namespace", "owned", "--data-dir",
                               sys.argv[1], "--partitions", "2", "--quiet"], stdout=subprocess.DEVNULL)
    start_ray()
    postgres = PostgresServer().start()
    with Client(broker.bootstrap_servers, "owned") as client:
        client.wait_for_topics(timeout=300)
        sent = client.submit([{"id": f"k{k}", "proc": "micro_rmw", "args": {"keys": [k]}} for k in (0, 1)])
        assert len(client.wait(sent, timeout=300)) == 2  # both Ray workers of `ordo run` are up
    with open(os.path.join(postgres.root, "data", "postmaster.pid")) as f:
        print("postgres", f.readline().strip(), postgres.root, flush=True)
    print("ready", flush=True)
    time.sleep(3600)
""")


def servers_of(owner: psutil.Process, postgres_pid: int) -> dict[int, str]:
    """Every process the owner started, with its command line: its descendants, and the
    PostgreSQL server, which pg_ctl daemonizes away from them."""
    found = {}
    for process in [*owner.children(recursive=True), psutil.Process(postgres_pid)]:
        try:
            found[process.pid] = " ".join(process.cmdline())
        except psutil.NoSuchProcess:
            pass
    return found


def left(servers: dict[int, str]) -> dict[int, str]:
    alive = {}
    for pid, command in servers.items():
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE and " ".join(process.cmdline()) == command:
                alive[pid] = command
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_servers_stop_when_their_owner_is_killed_midway(stop_signal, fault_report, tmp_path):
    try:
        find_bindir()
    except BaselineUnavailable as exc:
        pytest.skip(str(exc))
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path / "d")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    try:
        postgres_pid, postgres_root = None, None
        for line in owner.stdout:
            if line.startswith("postgres "):
                _, pid, postgres_root = line.split()
                postgres_pid = int(pid)
            if line.strip() == "ready":
                break
        assert postgres_pid is not None, f"the owner ended before its servers were up (exit {owner.wait()})"
        servers = servers_of(psutil.Process(owner.pid), postgres_pid)
        kinds = {
            kind: [pid for pid, command in servers.items() if marker in command]
            for kind, marker in (
                ("kafka", "kafka.Kafka"),
                ("ray", "ray"),
                ("postgres", postgres_root),
                ("ordo run", "ordo.cli run"),
                ("sequencer", "ordo.cli sequence"),
            )
        }
        assert all(kinds.values()), kinds  # one of each is running
        killed = time.monotonic()
        owner.send_signal(stop_signal)
        owner.wait(60)
        gone_after = {}  # kind -> seconds until its last process was gone
        # The kernel and the watchers act within a second; a broker's controlled shutdown takes
        # seconds on a busy machine. An `ordo run` left behind gives up on its lost broker only
        # after a minute: well past this.
        deadline = killed + 45
        while True:
            remaining = left(servers)
            for kind, pids in kinds.items():
                if kind not in gone_after and not any(pid in remaining for pid in pids):
                    gone_after[kind] = time.monotonic() - killed
            if not remaining or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        fault_report(
            f"owner {signal.Signals(stop_signal).name}ed holding {len(servers)} processes "
            f"({', '.join(f'{k}: {len(v)}' for k, v in kinds.items())}); left after it: {len(remaining)}; "
            f"gone after {', '.join(f'{k} {s:.1f} s' for k, s in gone_after.items())}"
        )
        assert not remaining, "\n".join(f"{pid}: {command[:300]}" for pid, command in remaining.items())
        assert not os.path.exists(postgres_root)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
