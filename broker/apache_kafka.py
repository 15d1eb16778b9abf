"""Apache Kafka on this machine: one KRaft node (broker and controller in one process) or a
cluster of them on loopback ports, its logs on disk.

The jars come from Maven Central once (ordo/maven.py). `broker_settings` is the one place that
says how Ordo's Kafka is configured: the launcher writes it into each node's properties, and
docker-compose.yml is checked against it (tests/test_docker_compose.py).
"""

from __future__ import annotations

import atexit
import base64
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
import weakref
from dataclasses import dataclass, field

from ordo.maven import Artifacts, java_binary, jars

KAFKA_VERSION = "4.1.1"
KAFKA = Artifacts(
    "kafka",
    (
        f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
        # Kafka logs through SLF4J 1.7; this routes it to Log4j 2.
        "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3",
    ),
)

_live: weakref.WeakSet[KafkaCluster] = weakref.WeakSet()

_quiet = logging.getLogger("ordo.broker.startup")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False

# Warnings and errors only: a node's INFO lines run to megabytes in a test session.
_LOG4J = """status = error
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
"""


# The broker's heap, fixed in size (the collector never resizes it), and its collector: ZGC,
# whose pauses last under a millisecond. Under Kafka's own choice, G1 with a 20 ms pause goal,
# the broker stopped for 7-50 ms about every 2 s at 2,000 requests/s on two cores, and
# every hop the broker answers (a produce's acknowledgement, a fetch) has those stops as its
# tail (docs/benchmarks.md, "The broker's collector").
DEFAULT_HEAP = "768m"
HEAP_ENV = (
    "ORDO_BROKER_HEAP"  # another heap size, as the JVM writes it (2g); not ORDO_KAFKA_*: those are client settings
)
JVM_GC_OPTIONS = ("-XX:+UseZGC",)


def jvm_heap_options(heap: str) -> list[str]:
    return [f"-Xmx{heap}", f"-Xms{heap}"]


def broker_settings(nodes: int) -> dict[str, str]:
    """What every node of an Ordo Kafka cluster of `nodes` nodes runs with, beyond its own
    addresses: Kafka's defaults, but internal topics sized for the cluster (one node cannot
    hold three replicas, and without a transaction log `ordo upgrade` cannot commit), and with
    three or more nodes every write acknowledged by two replicas before it counts."""
    replicas = min(nodes, 3)
    in_sync = 2 if replicas >= 3 else 1
    return {
        "num.partitions": "1",
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(in_sync),
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(in_sync),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(in_sync),
        "unclean.leader.election.enable": "false",
        # Ordo creates its topics with the settings they need (the log keeps every record); a
        # client naming a topic before `ordo run` made it must not get one with defaults.
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
    }


def new_cluster_id() -> str:
    """A random id as Kafka spells one; never with a leading dash, which its tools would
    read as an option (Kafka's own Uuid.randomUuid draws again for the same reason)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def _free_ports(count: int, host: str) -> list[int]:
    import socket

    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class Listener:
    """A client-facing listener beyond the plain one: a name, a security protocol, and the
    node settings that protocol needs (`{port}` and `{node}` are filled in per node)."""

    name: str
    protocol: str
    settings: dict[str, str] = field(default_factory=dict)


class KafkaNode:
    """One KRaft node process of a cluster."""

    def __init__(
        self, cluster: KafkaCluster, node_id: int, port: int, controller_port: int, extra_ports: dict[str, int]
    ):
        self.cluster, self.node_id = cluster, node_id
        self.port, self.controller_port, self.extra_ports = port, controller_port, extra_ports
        self.log_dir = os.path.join(cluster.data_dir, f"node-{node_id}")
        self.log_path = os.path.join(cluster.data_dir, f"node-{node_id}.out")
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.cluster.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.is_running() else None

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def properties(self) -> dict[str, str]:
        host = self.cluster.host
        listeners = {"PLAINTEXT": self.port, "CONTROLLER": self.controller_port, **self.extra_ports}
        protocols = {
            "PLAINTEXT": "PLAINTEXT",
            "CONTROLLER": "PLAINTEXT",
            **{listener.name: listener.protocol for listener in self.cluster.listeners},
        }
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.cluster.voters,
            "listeners": ",".join(f"{name}://{host}:{port}" for name, port in listeners.items()),
            "advertised.listeners": ",".join(
                f"{name}://{host}:{port}" for name, port in listeners.items() if name != "CONTROLLER"
            ),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(f"{name}:{protocol}" for name, protocol in protocols.items()),
            "log.dirs": self.log_dir,
            **broker_settings(len(self.cluster.nodes)),
            **self.cluster.settings,
        }
        for listener in self.cluster.listeners:
            for key, value in listener.settings.items():
                settings[key.format(node=self.node_id)] = value.format(
                    node=self.node_id, port=self.extra_ports[listener.name]
                )
        return settings

    def _write_properties(self) -> str:
        path = os.path.join(self.cluster.data_dir, f"node-{self.node_id}.properties")
        with open(path, "w") as f:
            f.writelines(f"{key}={value}\n" for key, value in self.properties().items())
        return path

    def _format(self, properties: str) -> None:
        if os.path.exists(os.path.join(self.log_dir, "meta.properties")):
            return  # a node that has data keeps it: formatting is for a new node only
        result = subprocess.run(
            [
                java_binary(),
                "-cp",
                self.cluster.classpath,
                "kafka.tools.StorageTool",
                "format",
                "-t",
                self.cluster.cluster_id,
                "-c",
                properties,
                "--ignore-formatted",
                *self.cluster.format_args,
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"could not format Kafka node {self.node_id}'s log directory {self.log_dir}: "
                f"{' '.join((result.stdout + result.stderr).split())[-300:]}"
            )

    def start(self) -> None:
        if self.is_running():
            return
        properties = self._write_properties()
        self._format(properties)
        log4j = os.path.join(self.cluster.data_dir, "log4j2.properties")
        with open(log4j, "w") as f:
            f.write(_LOG4J)
        command = [
            java_binary(),
            *jvm_heap_options(os.environ.get(HEAP_ENV, DEFAULT_HEAP)),
            *JVM_GC_OPTIONS,
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}",
            *self.cluster.jvm_options,
            "-cp",
            self.cluster.classpath,
            "kafka.Kafka",
            properties,
        ]
        with open(self.log_path, "ab") as out:
            # Own process group, so a Ctrl-C aimed at the caller reaches the broker only
            # through the caller's shutdown; and the parent's death stops it (no orphan
            # holding the port).
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_stop_with_parent,
            )

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def stop(self, grace: float = 15.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.kill(process.pid, signal.SIGCONT)  # a stopped node cannot shut down
            os.kill(process.pid, signal.SIGTERM)  # a controlled shutdown: leadership moves first
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL: what a crash or a power cut does to the process (its data stays on disk)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, "rb") as f:
                text = f.read()[-8192:].decode(errors="replace")
        except OSError:
            return "(no broker log)"
        tail = "\n".join(text.splitlines()[-lines:])
        return (
            f"--- Kafka node {self.node_id} log {self.log_path} (tail) ---\n{tail}"
            if tail
            else f"(Kafka node {self.node_id}'s log is empty)"
        )


def node_still_running(data_dir: str) -> bool:
    """Whether a Kafka node process still holds a log directory of the cluster in
    `data_dir` (Kafka keeps a lock on its `.lock` file for as long as the process lives)."""
    import fcntl
    import glob

    for lock in glob.glob(os.path.join(data_dir, "node-*", ".lock")):
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue  # removed by a node that stopped just now
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)  # closing releases a lock taken here
    return False


def _stop_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class KafkaCluster:
    """Apache Kafka on loopback: `with KafkaCluster() as kafka: kafka.bootstrap_servers`.

    `nodes` KRaft nodes, each broker and controller at once. With `data_dir` the logs live
    there and survive a stop (a later cluster on the same directory takes the same ports and
    carries on); without, a temporary directory is removed at stop."""

    engine = "kafka"

    def __init__(
        self,
        nodes: int = 1,
        data_dir: str | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        settings: dict[str, str] | None = None,
        listeners: list[Listener] | None = None,
        jvm_options: list[str] | None = None,
        cluster_id: str | None = None,
        format_args: list[str] | None = None,
    ):
        if nodes < 1:
            raise ValueError(f"a Kafka cluster needs at least one node, not {nodes}")
        self.host = host
        self.settings = dict(settings or {})
        self.listeners = list(listeners or [])
        self.jvm_options = list(jvm_options or [])
        # Extra arguments for `kafka-storage format` of a new node, e.g. `--add-scram
        # 'SCRAM-SHA-512=[name=admin,password=…]'`: SCRAM users that a SASL listener (and
        # an inter-broker listener on it) can authenticate from the first start.
        self.format_args = list(format_args or [])
        self._new_cluster_id = cluster_id
        self._own_dir = data_dir is None
        self.data_dir = os.path.abspath(data_dir) if data_dir else tempfile.mkdtemp(prefix="ordo-kafka-")
        os.makedirs(self.data_dir, exist_ok=True)
        layout = self._layout(nodes, port)
        self.cluster_id = layout["cluster_id"]
        self.nodes = [
            KafkaNode(self, node["id"], node["port"], node["controller_port"], node.get("extra", {}))
            for node in layout["nodes"]
        ]
        self.classpath = ""

    def _layout(self, nodes: int, port: int | None) -> dict:
        """The cluster's id and ports: kept in the data directory, so a restart on it finds
        its nodes where clients and the other nodes expect them."""
        path = os.path.join(self.data_dir, "ordo-kafka.json")
        if os.path.exists(path):
            with open(path) as f:
                layout = json.load(f)
            if len(layout["nodes"]) != nodes:
                raise RuntimeError(
                    f"{self.data_dir} holds a Kafka cluster of {len(layout['nodes'])} node(s), not "
                    f"{nodes}: use --nodes {len(layout['nodes'])} or another data directory"
                )
            if port is not None and layout["nodes"][0]["port"] != port:
                raise RuntimeError(
                    f"{self.data_dir} holds a Kafka cluster on port {layout['nodes'][0]['port']}, "
                    f"not {port}: leave --port out or use another data directory"
                )
            if [listener.name for listener in self.listeners] != layout.get("listeners", []):
                raise RuntimeError(
                    f"{self.data_dir} holds a Kafka cluster with listeners "
                    f"{layout.get('listeners', [])}, not those asked for"
                )
            return layout
        names = [listener.name for listener in self.listeners]
        ports = _free_ports(nodes * (2 + len(names)), self.host)
        if port is not None:
            ports[0] = port
        layout = {
            "cluster_id": self._new_cluster_id or new_cluster_id(),
            "version": KAFKA_VERSION,
            "listeners": names,
            "nodes": [
                {
                    "id": i + 1,
                    "port": ports[i * (2 + len(names))],
                    "controller_port": ports[i * (2 + len(names)) + 1],
                    "extra": {name: ports[i * (2 + len(names)) + 2 + k] for k, name in enumerate(names)},
                }
                for i in range(nodes)
            ],
        }
        with open(path, "w") as f:
            json.dump(layout, f, indent=1)
        return layout

    @property
    def voters(self) -> str:
        return ",".join(f"{node.node_id}@{self.host}:{node.controller_port}" for node in self.nodes)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.address for node in self.nodes)

    def listener_servers(self, name: str) -> str:
        return ",".join(f"{self.host}:{node.extra_ports[name]}" for node in self.nodes)

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def pid(self) -> int | None:
        return self.nodes[0].pid

    def is_running(self) -> bool:
        return all(node.is_running() for node in self.nodes)

    def start(self, timeout: float = 90.0) -> str:
        self.classpath = os.pathsep.join(jars(KAFKA))
        _live.add(self)
        try:
            for node in self.nodes:
                node.start()
            self.wait_until_serving(timeout)
        except BaseException:
            self.stop()
            raise
        return self.bootstrap_servers

    def restart_node(self, index: int, timeout: float = 90.0) -> None:
        self.nodes[index].start()
        self.wait_until_serving(timeout)

    def wait_until_serving(self, timeout: float = 90.0) -> None:
        """Until a real metadata request lists every node as a broker (an open port is not
        enough: a node accepts connections before it has joined the quorum)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0, "logger": _quiet})
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            for node in self.nodes:
                if node.process is not None and node.process.poll() is not None:
                    raise RuntimeError(
                        f"Kafka node {node.node_id} exited with code {node.process.returncode} while "
                        f"starting on {node.address} (its log: {node.log_path})\n{node.log_tail()}"
                    )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(
                    f"Kafka on {self.bootstrap_servers} did not serve metadata within {timeout:.0f}s "
                    f"({last}; logs in {self.data_dir})\n{self.nodes[0].log_tail()}"
                )
            try:
                brokers = admin.list_topics(timeout=min(1.0, remaining)).brokers
                if len(brokers) >= len(self.nodes):
                    return
                last = f"{len(brokers)} of {len(self.nodes)} nodes registered"
            except Exception as exc:
                last = str(exc)
            time.sleep(0.1)

    def leader_of(self, topic: str, partition: int = 0, timeout: float = 10.0) -> int:
        """The index in `nodes` of the node that leads `topic`'s partition now."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "logger": _quiet})
        leader = admin.list_topics(topic, timeout=timeout).topics[topic].partitions[partition].leader
        return next(i for i, node in enumerate(self.nodes) if node.node_id == leader)

    def log_tail(self) -> str:
        return "\n".join(node.log_tail() for node in self.nodes)

    def stop(self, grace: float = 15.0) -> None:
        # Data that is thrown away needs no controlled shutdown.
        grace = 0.0 if self._own_dir else grace
        for node in self.nodes:
            if grace:
                node.stop(grace)
            else:
                node.kill()
        _live.discard(self)
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@atexit.register
def _stop_all() -> None:
    for cluster in list(_live):
        cluster.stop(grace=5.0)
