"""docker-compose.yml and Dockerfile, checked structurally (Docker does not run in the tests)."""

import os
import re
import shlex
import tomllib

import pytest
import yaml

from ordo.broker.apache_kafka import (
    DEFAULT_HEAP,
    JVM_GC_OPTIONS,
    KAFKA_VERSION,
    KafkaCluster,
    broker_settings,
    jvm_heap_options,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def compose() -> dict:
    with open(os.path.join(ROOT, "docker-compose.yml")) as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def kafka_env(compose) -> dict[str, str]:
    env = compose["services"]["kafka"]["environment"]
    if isinstance(env, list):  # both compose spellings: mapping or KEY=VALUE list
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


@pytest.fixture(scope="module")
def dockerfile() -> list[str]:
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        text = f.read().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def command_args(service: dict) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def flag(args: list[str], name: str) -> str:
    assert name in args, f"{name} missing from {args}"
    return args[args.index(name) + 1]


def test_both_services_exist(compose):
    assert {"kafka", "ordo"} <= set(compose["services"])


def test_kafka_is_the_official_image_in_single_node_kraft_mode(compose, kafka_env):
    assert compose["services"]["kafka"]["image"].startswith("apache/kafka:")
    assert set(kafka_env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node = kafka_env["KAFKA_NODE_ID"]
    voters = kafka_env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert len(voters) == 1 and voters[0].startswith(f"{node}@kafka:")
    controller = kafka_env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert f"{controller}://" in kafka_env["KAFKA_LISTENERS"]
    assert "KAFKA_ZOOKEEPER_CONNECT" not in kafka_env


# Where a node listens and what it is: these differ between the compose network and loopback.
NODE_SETTINGS = {
    "node.id",
    "process.roles",
    "controller.quorum.voters",
    "controller.listener.names",
    "listeners",
    "advertised.listeners",
    "listener.security.protocol.map",
    "inter.broker.listener.name",
    "log.dirs",
}


# What the image's start script takes for the JVM, not for the server's properties.
JVM_VARIABLES = {"KAFKA_HEAP_OPTS", "KAFKA_JVM_PERFORMANCE_OPTS"}


def server_properties(kafka_env: dict[str, str]) -> dict[str, str]:
    """The server properties the apache/kafka image makes of KAFKA_* variables: the prefix
    dropped, lower case, `_` a dot, `__` an underscore, `___` a dash."""
    properties = {}
    for name, value in kafka_env.items():
        if name.startswith("KAFKA_") and name not in JVM_VARIABLES:
            key = name[len("KAFKA_") :].lower().replace("___", "-").replace("__", "\0").replace("_", ".")
            properties[key.replace("\0", "_")] = value
    return properties


def test_kafka_is_the_version_ordo_broker_and_the_tests_run(compose):
    assert compose["services"]["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"


def test_kafka_settings_are_exactly_those_ordo_broker_and_the_tests_run(kafka_env):
    shared = {k: v for k, v in server_properties(kafka_env).items() if k not in NODE_SETTINGS}
    assert shared == broker_settings(1)


def test_the_broker_jvm_is_the_one_ordo_broker_and_the_tests_run(kafka_env):
    assert kafka_env["KAFKA_HEAP_OPTS"].split() == jvm_heap_options(DEFAULT_HEAP)
    gc = [option for option in kafka_env["KAFKA_JVM_PERFORMANCE_OPTS"].split() if option.startswith("-XX:")]
    assert gc == list(JVM_GC_OPTIONS)


@pytest.mark.slow
def test_the_compose_broker_configuration_runs_ordo_here(kafka_env, tmp_path):
    """Docker does not run here: the same configuration (its cluster id and settings, with
    loopback addresses for the node's own) serves a real sequencer and engine."""
    from tests.helpers import assert_same_as_reference, run_engine, sequence_requests
    from ordo.procedures.workloads import sl

    settings = {k: v for k, v in server_properties(kafka_env).items() if k not in NODE_SETTINGS}
    with KafkaCluster(data_dir=str(tmp_path / "kafka"), settings=settings, cluster_id=kafka_env["CLUSTER_ID"]) as kafka:
        assert kafka.cluster_id == kafka_env["CLUSTER_ID"]
        last_batch, reference = sequence_requests(kafka.bootstrap_servers, "compose", list(sl.generate(300, seed=3)))
        outputs, digest = run_engine(kafka.bootstrap_servers, "compose", last_batch, tmp_path / "d", "vll", 1)
        assert_same_as_reference(outputs, digest, last_batch, reference)


def test_kafka_is_set_up_for_transactions_on_one_broker(kafka_env):
    assert kafka_env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    assert kafka_env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"
    assert kafka_env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"


def test_listeners_serve_the_compose_network_and_the_host(kafka_env):
    listeners = dict(re.match(r"(\w+)://(.*)", item).groups() for item in kafka_env["KAFKA_LISTENERS"].split(","))
    advertised = dict(
        re.match(r"(\w+)://(.*)", item).groups() for item in kafka_env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    )
    protocols = dict(item.split(":") for item in kafka_env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) <= set(protocols)
    assert "kafka:9092" in advertised.values()  # what the ordo service connects to
    host_side = [a for a in advertised.values() if a.split(":")[0] in ("127.0.0.1", "localhost")]
    assert host_side, "no listener advertised for clients on the host"
    assert kafka_env["KAFKA_INTER_BROKER_LISTENER_NAME"] in listeners


def test_published_ports_bind_loopback_only(compose):
    published = [p for service in compose["services"].values() for p in service.get("ports", [])]
    assert published, "kafka should be reachable from the host"
    for port in published:
        host_ip = port["host_ip"] if isinstance(port, dict) else str(port).split(":")[0]
        assert host_ip == "127.0.0.1", f"port {port} is not bound to 127.0.0.1"


def test_kafka_has_a_healthcheck(compose):
    check = compose["services"]["kafka"]["healthcheck"]
    test = check["test"] if isinstance(check["test"], str) else " ".join(check["test"])
    assert "kafka-broker-api-versions" in test or "kafka-topics" in test
    assert check.get("retries", 0) >= 1


def test_ordo_runs_with_the_documented_cli_flags(compose):
    args = command_args(compose["services"]["ordo"])
    assert args[0] == "run"
    assert flag(args, "--bootstrap-servers") == "kafka:9092"
    assert flag(args, "--namespace") == "ordo"
    assert flag(args, "--data-dir") == "/data"
    assert flag(args, "--scheduler") == "serial"


def test_ordo_flags_are_ones_the_cli_accepts(compose):
    from ordo.cli import build_parser

    args = build_parser().parse_args(command_args(compose["services"]["ordo"]))
    assert (args.command, args.bootstrap_servers, args.namespace, args.data_dir, args.scheduler) == (
        "run",
        "kafka:9092",
        "ordo",
        "/data",
        "serial",
    )


def test_ordo_waits_for_healthy_kafka_and_keeps_data_in_a_named_volume(compose):
    ordo = compose["services"]["ordo"]
    assert ordo["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "build" in ordo
    mounts = [v.split(":")[:2] if isinstance(v, str) else [v.get("source"), v["target"]] for v in ordo["volumes"]]
    sources = [source for source, target in mounts if target == "/data"]
    assert sources, "no volume mounted at /data"
    assert sources[0] in (compose.get("volumes") or {}), f"{sources[0]} is not a named volume"


def test_dockerfile_installs_the_project_with_the_ordo_entrypoint(dockerfile):
    assert dockerfile[0].startswith("FROM python:3.11-slim")
    assert any(re.match(r"RUN .*pip install (--\S+ )*\.(\s|$)", line) for line in dockerfile)
    entrypoints = [line for line in dockerfile if line.startswith("ENTRYPOINT")]
    assert entrypoints and entrypoints[-1] in ('ENTRYPOINT ["ordo"]', "ENTRYPOINT ordo")


def package_folder(package: str, package_dir: dict[str, str]) -> str:
    """The repository folder setuptools reads `package` from: under the folder
    [tool.setuptools.package-dir] maps its nearest mapped parent to, else its own path."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        parent = ".".join(parts[:n])
        if parent in package_dir:
            return "/".join([package_dir[parent], *parts[n:]])
    return "/".join(parts)


def test_package_folders_follow_the_package_dir_mapping():
    mapping = {"ordo.log": "log"}
    assert package_folder("ordo", mapping) == "ordo"
    assert package_folder("ordo.benchmarks", mapping) == "ordo/benchmarks"
    assert package_folder("ordo.log", mapping) == "log"
    assert package_folder("ordo.log.inner", mapping) == "log/inner"


def test_dockerfile_copies_every_package_pip_install_needs(dockerfile):
    """Every folder pyproject.toml installs from, the ones [tool.setuptools.package-dir] maps
    into the package (broker/, log/, …) included, is copied before `pip install .`."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    copied = {src.rstrip("/") for line in dockerfile if line.startswith("COPY ") for src in line.split()[1:-1]}
    if "." in copied:
        return
    setuptools = project["tool"]["setuptools"]
    package_dir = setuptools.get("package-dir", {})
    folders = {package_folder(p, package_dir).split("/")[0] for p in setuptools["packages"]}
    assert set(package_dir.values()) <= folders
    needed = folders | {"pyproject.toml"}
    if "readme" in project["project"]:
        needed.add(project["project"]["readme"])
    assert needed <= copied, f"Dockerfile does not copy {sorted(needed - copied)}"
