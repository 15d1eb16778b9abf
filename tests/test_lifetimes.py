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

OWNER = textwrap.dedent("""
    import os, sys, time
    from ordo.benchmarks.baseline import PostgresServer
    from ordo.scheduler.ray_group import start_ray
    from ordo.sequencer.broker import local_broker

    broker = local_broker()
    broker.start()
    start_ray()
    postgres = PostgresServer().start()
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
def test_servers_stop_when_their_owner_is_killed_midway(stop_signal, fault_report):
    try:
        find_bindir()
    except BaselineUnavailable as exc:
        pytest.skip(str(exc))
    owner = subprocess.Popen([sys.executable, "-c", OWNER], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": ROOT})
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
        kinds = {kind: [pid for pid, command in servers.items() if marker in command]
                 for kind, marker in (("kafka", "kafka.Kafka"), ("ray", "ray"), ("postgres", postgres_root))}
        assert all(kinds.values()), kinds  # one of each is running
        killed = time.monotonic()
        owner.send_signal(stop_signal)
        owner.wait(60)
        gone_after = {}  # kind -> seconds until its last process was gone
        deadline = killed + 120  # a broker's controlled shutdown takes seconds on a busy machine
        while (remaining := left(servers)) and time.monotonic() < deadline:
            for kind, pids in kinds.items():
                if kind not in gone_after and not any(pid in remaining for pid in pids):
                    gone_after[kind] = time.monotonic() - killed
            time.sleep(0.5)
        fault_report(f"owner {signal.Signals(stop_signal).name}ed holding {len(servers)} processes "
                     f"({', '.join(f'{k}: {len(v)}' for k, v in kinds.items())}); left after it: {len(remaining)}; "
                     f"gone after {', '.join(f'{k} {s:.1f} s' for k, s in gone_after.items())}")
        assert not remaining, "\n".join(f"{pid}: {command[:300]}" for pid, command in remaining.items())
        assert not os.path.exists(postgres_root)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
