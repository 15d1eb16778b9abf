"""`ordo run --partitions 2` starts Ray on this machine: nothing it starts, Ray's
servers and workers included, listens anywhere but on loopback."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time

import psutil
import pytest

from ordo.client import Client
from ordo.broker.topics import ensure_topics
from tests.helpers import ROOT, stop

pytestmark = pytest.mark.slow


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def listening(root: int) -> list[tuple[int, str, str, int]]:
    """(pid, name, address, port) of every listening TCP socket of a process tree."""
    found = []
    try:
        tree = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return found
    for process in tree:
        try:
            for connection in process.net_connections(kind="tcp"):
                if connection.status == psutil.CONN_LISTEN:
                    found.append((process.pid, process.name(), connection.laddr.ip, connection.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def test_is_loopback():
    assert all(map(is_loopback, ["127.0.0.1", "::1", "::ffff:127.0.0.1"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.0.2.2", "::ffff:10.0.0.1"]))


def test_ordo_run_on_two_partitions_listens_only_on_loopback(broker, namespace, tmp_path):
    ensure_topics(broker, namespace)
    # As a user starts it: without the test session's Ray settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "run",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--data-dir",
            str(tmp_path / "d"),
            "--partitions",
            "2",
            "--quiet",
            "--checkpoint-every",
            "0",
        ],
        cwd=ROOT,
        env={**env, "PYTHONPATH": ROOT},
    )
    try:
        with Client(broker, namespace) as client:
            # One transaction per partition, answered: both Ray workers are up and serving.
            ids = client.submit([{"id": f"net-{k}", "proc": "micro_rmw", "args": {"keys": [k]}} for k in (0, 1)])
            outcomes = client.collect(ids, timeout=180)
        assert {o["status"] for found in outcomes.values() for o in found} == {"committed"}, outcomes
        assert engine.poll() is None
        time.sleep(1)
        sockets = listening(engine.pid)
        names = {name for _, name, _, _ in sockets}
        assert {"gcs_server", "raylet"} <= names, f"Ray's servers not found in the process tree: {sockets}"
        outside = [s for s in sockets if not is_loopback(s[2])]
        assert not outside, f"listening outside loopback: {outside}"
        # The dashboard is off: its process runs for Ray's own calls, but serves no web UI.
        dashboards = [
            p.pid
            for p in psutil.Process(engine.pid).children(recursive=True)
            if "dashboard/dashboard.py" in " ".join(p.cmdline())
        ]
        assert not [s for s in sockets if s[0] in dashboards], sockets
    finally:
        stop(engine, timeout=60)
