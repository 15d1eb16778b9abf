"""What cannot work is refused at start in one line, exit 2, instead of a hang, a restart
loop or a traceback: settings out of range, a sequencer that fails at every start, a data
directory that is a file, read-only or on a full disk, a Kafka settings file that is not
text."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from ordo.client import Client
from ordo.broker.topics import ensure_topics
from tests.helpers import ROOT, ordo, stop


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORDO_")}
    return {**env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT, **extra}


def _ordo(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ordo.cli", *args],
        cwd=ROOT,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr[-3000:])
    return lines[0]


@pytest.mark.parametrize(
    "setting, value, accepted",
    [
        ("ORDO_MAX_TXNS", "0", "from 1 to 1,000,000"),
        ("ORDO_MAX_TXNS", "-1", "from 1 to 1,000,000"),
        ("ORDO_MAX_DELAY_MS", "nan", "from 0 to 60,000"),
        ("ORDO_MAX_DELAY_MS", "-1", "from 0 to 60,000"),
        ("ORDO_DEDUPE_WINDOW", "0", "of 1 or more"),
        ("ORDO_DEDUPE_WINDOW", "-1", "of 1 or more"),
        ("ORDO_METRICS_PORT", "99999", "from 0 to 65,535"),
        ("ORDO_PARTITIONS", "0", "of 1 or more"),
        ("ORDO_WAIT_FOR_BROKER", "inf", "from 0 to 86,400"),
        ("ORDO_MAX_BYTES", "2000000000", "from 1 to 999,934,464"),
    ],
)
def test_a_setting_out_of_range_is_refused_in_one_line(tmp_path, setting, value, accepted):
    """Each of these was taken and then sequenced nothing, restarted the sequencer in a
    loop or crashed: now `ordo run` refuses it before it connects to anything."""
    done = _ordo(
        "run", "--bootstrap-servers", "127.0.0.1:1", "--data-dir", str(tmp_path / "d"), env=_env(**{setting: value})
    )
    line = _one_line(done)
    assert setting in line and repr(value) in line and accepted in line, line


def test_a_setting_out_of_range_on_the_command_line_names_the_option(tmp_path):
    done = _ordo("sequence", "--bootstrap-servers", "127.0.0.1:1", "--max-delay-ms", "nan")
    assert done.returncode == 2
    assert "argument --max-delay-ms: 'nan' is not a number from 0 to 60,000" in done.stderr


def test_a_kafka_settings_file_that_is_not_text_is_named(tmp_path):
    path = tmp_path / "kafka.properties"
    path.write_bytes(bytes(range(256)) * 4)
    line = _one_line(_ordo("submit", "--bootstrap-servers", "127.0.0.1:1", "--proc", "p", "--kafka-config", str(path)))
    assert str(path) in line and "not UTF-8" in line, line


@pytest.mark.slow
def test_a_batch_larger_than_the_log_takes_is_refused_before_anything_starts(broker, namespace, tmp_path):
    """The log's max.message.bytes is checked against --max-bytes up front: a full batch would
    otherwise fail the sequencer at every start. A log Ordo creates takes the size asked for."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    ensure_topics(broker, namespace)  # a log with the broker's default record limit
    common = ("--bootstrap-servers", broker, "--max-bytes", "2000000", "--quiet")
    line = _one_line(_ordo("run", *common, "--namespace", namespace, "--data-dir", str(tmp_path / "a"), timeout=120))
    assert f"topic {namespace}.log takes records of at most" in line and "max.message.bytes" in line, line
    assert "--max-bytes" in line, line
    fresh = f"{namespace}-big"
    engine = ordo(
        "run", *common, "--namespace", fresh, "--data-dir", str(tmp_path / "b"), "--procedures", "tests.key_procedures"
    )
    try:
        admin = AdminClient({"bootstrap.servers": broker})
        deadline = time.monotonic() + 120
        while f"{fresh}.log" not in admin.list_topics(timeout=10).topics:
            assert engine.poll() is None and time.monotonic() < deadline, "the engine did not create its log"
            time.sleep(0.2)
        (future,) = admin.describe_configs([ConfigResource("topic", f"{fresh}.log")]).values()
        assert int(future.result(30)["max.message.bytes"].value) >= 2_000_000
        with Client(broker, fresh) as client:  # and the engine runs with it
            ids = client.submit([{"id": "one", "proc": "key_analyzed", "args": {"v": {"k": 1}}}])
            assert client.collect(ids, timeout=120)["one"][0]["status"] == "committed"
    finally:
        assert stop(engine, 60) == 0


@pytest.mark.slow
def test_a_sequencer_that_fails_at_every_start_stops_the_engine_with_its_reason(broker, namespace, tmp_path):
    """Its procedures module imports in `ordo run` but not in the sequencer process: the
    engine gives the sequencer up after a few fast failures instead of restarting it for
    ever, and says why in its last line."""
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
        "--procedures",
        "tests.sequencer_only_failing_procedures",
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, stderr = engine.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        stop(engine)
        raise AssertionError("ordo run kept restarting a sequencer that fails at every start")
    last = stderr.strip().splitlines()[-1]
    assert engine.returncode == 2, stderr[-3000:]
    assert last.startswith("ordo run: the sequencer failed 3 times within"), last
    assert "cannot be imported in the sequencer process" in last, last
    assert stderr.count("exited with 2; restarting") == 2


def test_a_data_directory_that_is_a_file_is_one_line(broker, namespace, tmp_path):
    path = tmp_path / "data"
    path.write_text("not a directory")
    line = _one_line(
        _ordo(
            "execute",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--data-dir",
            str(path),
            "--runtime",
            "local",
        )
    )
    assert str(path) in line and "is a file, not a directory" in line, line


@contextmanager
def _tmpfs(path, options: str):
    """A small file system of its own (root only): a disk that can be full or read-only."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.slow
def test_a_read_only_data_directory_is_one_line(broker, namespace, tmp_path):
    ensure_topics(broker, namespace)
    with _tmpfs(tmp_path / "ro", "size=1m,ro") as disk:
        line = _one_line(
            _ordo(
                "execute",
                "--bootstrap-servers",
                broker,
                "--namespace",
                namespace,
                "--data-dir",
                str(disk / "data"),
                "--runtime",
                "local",
            )
        )
        assert str(disk / "data") in line and "Read-only file system" in line, line


def _fill(disk) -> None:
    """Write to the disk until it has no room left (RocksDB may have taken it all already:
    it reserves room for its files ahead)."""
    for chunk in (65536, 1):
        try:
            with open(disk / f"filler-{chunk}", "wb") as f:
                while True:
                    f.write(b"\0" * chunk)
                    f.flush()
        except OSError:
            pass


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [1, 2], ids=["local", "ray"])
def test_a_full_disk_stops_the_engine_with_one_line_also_on_restart(broker, namespace, tmp_path, partitions):
    """The disk fills while the engine runs: it stops with one line naming the shard and
    the cause, exit 2, and so does every start on the still full disk; with Ray workers
    too, whose failure crosses to the engine whole."""
    from kafka import KafkaProducer

    ensure_topics(broker, namespace)
    common = (
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--partitions",
        str(partitions),
        "--checkpoint-every",
        "0",
    )
    with _tmpfs(tmp_path / "disk", "size=32m") as disk:
        data = str(disk / "data")
        engine = ordo("run", *common, "--data-dir", data, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while not all(os.path.isdir(os.path.join(data, f"shard-{p}")) for p in range(partitions)):
                assert engine.poll() is None and time.monotonic() < deadline, "the engine did not start"
                time.sleep(0.2)
            _fill(disk)
            producer = KafkaProducer(bootstrap_servers=broker)
            for i in range(200):
                producer.send(
                    f"{namespace}.requests",
                    key=b"r%d" % i,
                    value=b'{"id":"r%d","proc":"micro_rmw","args":{"keys":[%d]}}' % (i, i),
                )
            producer.flush()
            producer.close()
            _, stderr = engine.communicate(timeout=120)
        except BaseException:
            stop(engine)
            raise
        lines = stderr.strip().splitlines()
        assert engine.returncode == 2 and "Traceback" not in stderr, stderr[-3000:]
        assert data in lines[-1] and "No space left on device" in lines[-1], lines[-1]

        again = _ordo("run", *common, "--data-dir", data, timeout=180)
        assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr[-3000:]
        last = again.stderr.strip().splitlines()[-1]
        assert data in last and "No space left on device" in last, last
