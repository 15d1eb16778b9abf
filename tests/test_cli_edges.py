"""Everyday command-line paths a new user hits: output piped into `head`, and a broker
that is not there."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from ordo.app import App
from ordo.testing import TestEngine
from tests.helpers import ROOT

ORDO = f"{sys.executable} -m ordo.cli"


def shell(command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=timeout,
    )


@pytest.fixture
def data_dir(tmp_path):
    """A data directory with a few thousand records, written by the real workers."""
    app = App("edges")
    app.table("t")

    def fill(ctx, args):
        for key in range(4000):
            ctx.write("t", key, key)

    app.procedure("fill", args={}, analyze=lambda args: ([], [("t", k) for k in range(4000)]))(fill)
    path = str(tmp_path / "d")
    with TestEngine(app, data_dir=path) as engine:
        assert engine.call("fill", {})["status"] == "committed"
        assert engine.read("t", 3999) == 3999
    return path


def test_dump_into_head_ends_quietly(data_dir):
    done = shell(f"{ORDO} dump --data-dir {data_dir} | head -n 2")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines() == ['{"table": "t", "key": 0, "value": 0}', '{"table": "t", "key": 1, "value": 1}']


def test_gen_into_head_ends_quietly():
    done = shell(f"{ORDO} gen micro --count 200000 | head -n 1")
    assert done.returncode == 0 and done.stderr == "" and len(done.stdout.splitlines()) == 1


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once closed


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--data-dir", "{tmp}/d"],
        ["execute", "--data-dir", "{tmp}/d"],
        ["sequence"],
        ["recover", "--data-dir", "{tmp}/d"],
        ["submit", "--proc", "sl_deposit", "--args", "{{}}", "--wait"],
    ],
)
def test_an_unreachable_broker_is_one_line_at_once(tmp_path, command):
    port = closed_port()
    args = [a.format(tmp=tmp_path) for a in command]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ordo.cli", args[0], "--bootstrap-servers", f"127.0.0.1:{port}", *args[1:]],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 2
    assert elapsed < 15, f"took {elapsed:.0f} s"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"ordo {args[0]}: no Kafka broker answers at 127.0.0.1:{port} within 5 s")


@pytest.mark.slow
def test_a_data_directory_of_another_namespace_is_refused_before_any_topic_is_made(broker, namespace, tmp_path):
    from confluent_kafka.admin import AdminClient

    from tests.helpers import ordo, stop

    data_dir = str(tmp_path / "d")
    first = ordo("run", "--bootstrap-servers", broker, "--namespace", namespace, "--data-dir", data_dir, "--quiet")
    time.sleep(8)
    assert stop(first) == 0
    other = f"{namespace}-other"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "run",
            "--bootstrap-servers",
            broker,
            "--namespace",
            other,
            "--data-dir",
            data_dir,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"ordo run: {data_dir} holds the state of namespace '{namespace}', not "
        f"'{other}': use --namespace {namespace} or a new data directory"
    ]
    topics = AdminClient({"bootstrap.servers": broker}).list_topics(timeout=10).topics
    assert not [t for t in topics if t.startswith(f"{other}.")]
    recover = subprocess.run(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "recover",
            "--bootstrap-servers",
            broker,
            "--namespace",
            other,
            "--data-dir",
            data_dir,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert recover.returncode == 2 and f"holds the state of namespace '{namespace}'" in recover.stderr


def test_gen_names_and_describes_every_workload():
    from ordo.cli import WORKLOAD_NAMES
    from ordo.procedures.workloads import ALL_WORKLOADS

    assert list(WORKLOAD_NAMES) == list(ALL_WORKLOADS)
    described = shell(f"{ORDO} gen --list").stdout.splitlines()
    heads = [line.split(":", 1) for line in described if not line.startswith(" ")]
    assert [name for name, _ in heads] == list(ALL_WORKLOADS)
    assert all(len(text.strip()) > 20 and not text.strip().startswith(name) for name, text in heads)
    assert ", ".join(ALL_WORKLOADS) in " ".join(shell(f"{ORDO} gen --help").stdout.split())


def test_librdkafka_repeating_one_failure_is_one_line_per_cause_and_interval():
    code = """
import logging, time
from confluent_kafka import Consumer
from ordo.broker.clients import LIBRDKAFKA_LOGGER, kafka_config
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
LIBRDKAFKA_LOGGER.setLevel(logging.DEBUG)   # as --log-level info sets it
consumer = Consumer(kafka_config("127.0.0.1:1", {"group.id": "g", "reconnect.backoff.ms": 10,
                                                 "reconnect.backoff.max.ms": 20}))
started = time.monotonic()
while time.monotonic() - started < 5:
    consumer.poll(0.1)
consumer.close()
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("ordo.librdkafka")]
    assert 1 <= len(lines) <= 3, lines  # hundreds without the filter
    assert "Connection refused" in lines[0]


@pytest.mark.slow
def test_log_level_debug_shows_each_batch_s_path(broker, namespace, tmp_path):
    from ordo.client import Client
    from tests.helpers import ordo, stop

    engine = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path / "d"),
        "--runtime",
        "local",
        "--quiet",
        "--log-level",
        "debug",
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with Client(broker, namespace) as client:
            client.wait_for_topics(60)
            request_id = client.submit("sl_deposit", {"account": 1, "asset": 1, "account_amount": 1, "asset_amount": 1})
            outcome = client.wait_one(request_id, timeout=120)
        time.sleep(2)
    finally:
        stop(engine)
    text = engine.stderr.read()
    batch = outcome["batch"]
    assert f"batch {batch}: 1 requests (0 rejected) from partition 0 [" in text
    assert f"partition 0: batch {batch} executed (1 outcomes, 2 changes) in " in text
    assert f"partition 0: batch {batch} applied to the shard" in text


def test_the_client_raises_its_own_errors_within_its_timeouts():
    import ordo
    from ordo.errors import BrokerUnavailable, OrdoError

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ordo.Client(f"127.0.0.1:{port}", "nowhere")
    calls = {
        "wait_for_topics": lambda: client.wait_for_topics(timeout=2),
        "submit": lambda: client.submit("deposit", {"account": 1}, timeout=2),
        "wait_one": lambda: client.wait_one("r-1", timeout=2),
        "stream": lambda: list(client.stream(idle=2)),
    }
    for name, call in calls.items():
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable) as raised:
            call()
        assert time.monotonic() - started < 8, name  # its own timeout (2 s), not librdkafka's
        assert isinstance(raised.value, (OrdoError, ConnectionError))
        assert str(raised.value).startswith(f"no Kafka broker answers at 127.0.0.1:{port} within 2 s"), name


@pytest.mark.slow
def test_ctrl_c_at_the_terminal_stops_ordo_run_without_a_restart(broker, namespace, tmp_path):
    import signal

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
            "--runtime",
            "local",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"},
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines = []
    for line in engine.stderr:
        lines.append(line)
        if line.startswith("ordo serving:"):
            break
    os.killpg(engine.pid, signal.SIGINT)  # the terminal's whole foreground process group
    rest = engine.communicate(timeout=60)[1]
    assert engine.returncode == 0, rest
    assert "restarting" not in rest and "Traceback" not in rest, rest
    assert rest.strip().splitlines()[-1].startswith("stopped after batch "), rest


def test_runtime_auto_is_ray_for_a_running_engine_and_this_process_for_recover():
    """`ordo recover` starts Ray only when asked (--runtime ray) or placed (--ray-address,
    --cores); `ordo run` and `ordo execute` keep Ray for more than one partition."""
    for command, auto in (
        ("run", "auto: Ray when there is more than one partition"),
        ("execute", "auto: Ray when there is more than one partition"),
        ("recover", "auto: in this process, unless --ray-address or --cores place the workers (then Ray)"),
    ):
        done = shell(f"COLUMNS=400 {ORDO} {command} --help")
        assert done.returncode == 0, done.stderr
        assert auto in " ".join(done.stdout.split()), (command, done.stdout)


@pytest.mark.parametrize(
    "argv, usage, unknown",
    [
        (
            ["submit", "--bootstrap-servers", "127.0.0.1:1", "--proc", "p", "--request-id", "x"],
            "ordo submit",
            "--request-id x",
        ),
        (["log", "skip", "--bootstrap-servers", "127.0.0.1:1", "--offset", "1", "--bogus"], "ordo log skip", "--bogus"),
    ],
)
def test_an_unknown_option_is_answered_with_its_command_s_usage(argv, usage, unknown, capsys):
    from ordo.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {usage} "), err
    assert f"{usage}: error: unrecognized arguments: {unknown}" in err


def test_a_bench_of_one_configuration_takes_mp_as_the_knob_or_refuses_it_in_one_line():
    """`--mp` is never passed over: one share is the workload's knob mp, several are for
    `ordo bench scale` only, and a workload without the knob refuses it."""
    from argparse import Namespace

    from ordo.cli import one_run_knobs
    from ordo.procedures.workloads import voter, ycsbt

    assert one_run_knobs(ycsbt, Namespace(knob=["records=2000"], mp="1"), "latency") == {"records": 2000, "mp": 1.0}
    assert one_run_knobs(ycsbt, Namespace(knob=[], mp=None), "latency") == {}
    with pytest.raises(ValueError, match="no multi-partition share"):
        one_run_knobs(voter, Namespace(knob=[], mp="1"), "latency")
    refused = shell(f"{sys.executable} -m ordo.cli bench latency ycsbt --rate 10 --mp 0,1")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "ordo bench: ordo bench latency measures one --mp share per run; ordo bench scale takes several"
    ]
