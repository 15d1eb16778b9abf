"""librdkafka settings from `--kafka-config FILE` and `ORDO_KAFKA_<SETTING>` reach every
Kafka client Ordo creates: the sequencer's, the engine's (its log follower and its
outputs), the client's; a setting librdkafka refuses is one line naming it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import psutil
import pytest

from ordo.broker.clients import TAIL_FETCH_WAIT_MS, consumer_config, kafka_config
from ordo.broker.client_settings import (
    KafkaSettingsError,
    env_name_for,
    merge_kafka_settings,
    parse_settings_text,
    setting_from_env_name,
    settings_from_env,
    user_kafka_settings,
)
from ordo.broker.topics import ensure_topics
from tests.helpers import ROOT, stop


def test_environment_names_map_to_settings_and_back():
    assert setting_from_env_name("ORDO_KAFKA_SECURITY_PROTOCOL") == "security.protocol"
    assert setting_from_env_name("ORDO_KAFKA_SASL_MECHANISM") == "sasl.mechanism"
    assert setting_from_env_name("ORDO_KAFKA_LOG__LEVEL") == "log_level"
    assert setting_from_env_name("ORDO_KAFKA_CONFIG") is None  # the file
    assert setting_from_env_name("ORDO_BOOTSTRAP_SERVERS") is None
    for setting in ("security.protocol", "log_level", "ssl.ca.location", "sasl.oauthbearer.client.id"):
        assert setting_from_env_name(env_name_for(setting)) == setting
    assert settings_from_env({"ORDO_KAFKA_CLIENT_ID": "a", "PATH": "/bin", "ORDO_KAFKA_CONFIG": "f"}) == {
        "client.id": "a"
    }


def test_file_formats():
    properties = "# comment\n! also\nsecurity.protocol = SASL_SSL\nsasl.mechanism: PLAIN\nsasl.password=a=b\n"
    assert parse_settings_text(properties, "properties") == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.password": "a=b",
    }
    toml = (
        'client.id = "x"\nsocket.keepalive.enable = true\n[sasl]\nmechanism = "PLAIN"\n[queue.buffering]\nmax.ms = 5\n'
    )
    assert parse_settings_text(toml, "toml") == {
        "client.id": "x",
        "socket.keepalive.enable": "true",
        "sasl.mechanism": "PLAIN",
        "queue.buffering.max.ms": "5",
    }
    assert parse_settings_text('{"client.id": "x", "retries": 3}', "json") == {"client.id": "x", "retries": "3"}
    with pytest.raises(KafkaSettingsError, match="line 2"):
        parse_settings_text("a=1\nno separator\n", "properties")
    with pytest.raises(KafkaSettingsError, match="JSON object"):
        parse_settings_text("[1]", "json")


def test_environment_wins_over_the_file_and_ordo_wins_over_both(tmp_path):
    assert merge_kafka_settings({"a": "1", "b": "1"}, {"b": "2"}) == {"a": "1", "b": "2"}
    path = tmp_path / "kafka.properties"
    path.write_text("client.id=from-file\nsocket.timeout.ms=7000\nfetch.wait.max.ms=400\n")
    environ = {"ORDO_KAFKA_CONFIG": str(path), "ORDO_KAFKA_CLIENT_ID": "from-env"}
    assert user_kafka_settings(environ) == {
        "client.id": "from-env",
        "socket.timeout.ms": "7000",
        "fetch.wait.max.ms": "400",
    }
    saved = dict(os.environ)
    try:
        os.environ.update(environ)
        config = consumer_config("127.0.0.1:1", {"group.id": "g"})
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert config["client.id"] == "from-env" and config["socket.timeout.ms"] == "7000"
    assert config["fetch.wait.max.ms"] == TAIL_FETCH_WAIT_MS  # the pipeline's own timing stays
    assert config["group.id"] == "g" and config["bootstrap.servers"] == "127.0.0.1:1"
    assert "client.id" not in kafka_config("127.0.0.1:1")  # nothing from the user here: no leftovers


def test_a_refused_setting_is_one_error_naming_it(tmp_path):
    with pytest.raises(KafkaSettingsError, match=r'ORDO_KAFKA_NO_SUCH_THING in the environment.*"no.such.thing"'):
        user_kafka_settings({"ORDO_KAFKA_NO_SUCH_THING": "1"})
    path = tmp_path / "k.toml"
    path.write_text('security.protocol = "carrier-pigeon"\n')
    with pytest.raises(KafkaSettingsError, match=rf'{re.escape(str(path))}.*"security.protocol"'):
        user_kafka_settings({"ORDO_KAFKA_CONFIG": str(path)})


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORDO_")}
    return {**env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT, **extra}


def _ordo(*args: str, env: dict, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ordo.cli", *args], cwd=ROOT, env=env, **kwargs)


@pytest.mark.parametrize("source", ["file", "environment"])
def test_cli_refuses_a_bad_setting_in_one_line(broker, tmp_path, source):
    if source == "file":
        path = tmp_path / "kafka.properties"
        path.write_text("client.id=ok\nbogus.setting=1\n")
        args, env, named = ["--kafka-config", str(path)], _env(), "bogus.setting"
    else:
        args, env, named = [], _env(ORDO_KAFKA_BOGUS_SETTING="1"), "ORDO_KAFKA_BOGUS_SETTING"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "submit",
            "--bootstrap-servers",
            broker,
            "--namespace",
            "unused",
            "--proc",
            "micro_rmw",
            "--args",
            '{"keys": [1]}',
            *args,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "bogus.setting" in lines[0], done.stderr


def _client_names(stderr: str, client_id: str) -> set[str]:
    """librdkafka names each client instance `<client.id>#producer-N` / `#consumer-N`."""
    return set(re.findall(rf"\[({re.escape(client_id)}#(?:producer|consumer)-\d+)\]", stderr))


@pytest.mark.slow
def test_settings_from_file_and_environment_reach_sequencer_engine_and_client(broker, namespace, tmp_path):
    """The file turns librdkafka's debug log on, the environment names the clients: each
    process's own clients log under that name, and the pipeline answers as usual."""
    ensure_topics(broker, namespace)
    settings = tmp_path / "kafka.toml"
    settings.write_text('debug = "generic"\n')
    env = _env(ORDO_KAFKA_CLIENT_ID=f"ordo-{os.getpid()}", ORDO_LOG_LEVEL="debug")
    client_id = env["ORDO_KAFKA_CLIENT_ID"]
    common = ["--bootstrap-servers", broker, "--namespace", namespace, "--kafka-config", str(settings)]
    logs = {name: open(tmp_path / f"{name}.err", "w+") for name in ("sequencer", "engine")}
    sequencer = _ordo("sequence", *common, env=env, stderr=logs["sequencer"])
    engine = _ordo("execute", *common, "--data-dir", str(tmp_path / "d"), "--quiet", env=env, stderr=logs["engine"])
    try:
        submit = subprocess.run(
            [
                sys.executable,
                "-m",
                "ordo.cli",
                "submit",
                *common,
                "--proc",
                "micro_rmw",
                "--args",
                '{"keys": [3]}',
                "--id",
                "k-1",
                "--wait",
                "--timeout",
                "120",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert submit.returncode == 0, submit.stderr[-2000:]
        assert '"status": "committed"' in submit.stdout
    finally:
        stop(engine, 60)
        stop(sequencer, 60)
    for name, log in logs.items():
        log.seek(0)
        text = log.read()
        log.close()
        clients = _client_names(text, client_id)
        kinds = {c.split("#")[1].split("-")[0] for c in clients}
        assert kinds == {"producer", "consumer"}, f"{name}: clients under the user's settings: {clients}"
    assert {"producer", "consumer"} <= {c.split("#")[1].split("-")[0] for c in _client_names(submit.stderr, client_id)}


@pytest.mark.slow
def test_ordo_run_hands_the_settings_to_its_sequencer_and_ray_workers(broker, namespace, tmp_path):
    ensure_topics(broker, namespace)
    settings = tmp_path / "kafka.properties"
    settings.write_text("client.id=ordo-run-settings\n")
    log = tmp_path / "run.err"
    with open(log, "w") as err:
        engine = _ordo(
            "run",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--data-dir",
            str(tmp_path / "d"),
            "--partitions",
            "2",
            "--kafka-config",
            str(settings),
            "--quiet",
            env=_env(ORDO_KAFKA_SOCKET_TIMEOUT_MS="20000"),
            stderr=err,
        )
    try:
        pids: list[int] = []
        deadline = time.monotonic() + 120
        while len(pids) < 2 and time.monotonic() < deadline:
            assert engine.poll() is None, log.read_text()
            pids = [int(pid) for pid in re.findall(r"partition \d+: pid (\d+)", log.read_text())]
            time.sleep(0.2)
        environs: dict[str, dict] = {}
        while len(environs) < 3 and time.monotonic() < deadline:
            assert engine.poll() is None, log.read_text()
            environs.update(_environs(engine.pid, pids))
            time.sleep(0.2)
        assert len(pids) == 2 and len(environs) == 3, (environs.keys(), log.read_text()[-2000:])
        for who, environ in environs.items():
            assert environ.get("ORDO_KAFKA_CONFIG") == str(settings), who
            assert environ.get("ORDO_KAFKA_SOCKET_TIMEOUT_MS") == "20000", who
    finally:
        stop(engine, 60)


def _environs(engine_pid: int, worker_pids: list[int]) -> dict[str, dict]:
    """The environments of the Ray workers and of the sequencer child that are alive now; a
    process that ends while it is read is simply not in the answer (it is asked again)."""
    found = {}
    for pid in worker_pids:
        try:
            found[f"worker {pid}"] = psutil.Process(pid).environ()
        except psutil.Error:
            pass
    try:
        children = psutil.Process(engine_pid).children()
    except psutil.Error:
        children = []
    for child in children:
        try:
            if "sequence" in child.cmdline():
                found["sequencer"] = child.environ()
        except psutil.Error:
            pass
    return found


def test_outputs_are_gzip_level_1_unless_the_user_names_a_codec():
    from ordo.scheduler.outputs import output_compression

    assert output_compression({}) == {"compression.type": "gzip", "compression.level": 1}
    assert output_compression({"compression.type": "zstd"}) == {}
    assert output_compression({"compression.codec": "none"}) == {}
