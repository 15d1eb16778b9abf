"""The broker Ordo starts on this machine: Apache Kafka (broker/apache_kafka.py) unless the
memory-only fallback is asked for (broker/tansu.py).

Tests, `ordo demo`, `ordo bench` and `ordo broker` all start theirs here, so one setting,
`ORDO_BROKER_ENGINE` (or `ordo broker --engine`), chooses for every one of them.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

from ordo.maven import MissingTool
from ordo.broker.apache_kafka import KAFKA_VERSION, KafkaCluster, node_still_running
from ordo.extras import MissingExtra
from ordo.broker.tansu import TansuBroker, free_port

ENGINES = ("kafka", "tansu")

__all__ = [
    "ENGINES",
    "KafkaCluster",
    "TansuBroker",
    "default_engine",
    "free_port",
    "local_broker",
    "run_broker_foreground",
]


def default_engine() -> str:
    engine = os.environ.get("ORDO_BROKER_ENGINE", "kafka").strip().lower() or "kafka"
    if engine not in ENGINES:
        raise ValueError(f"ORDO_BROKER_ENGINE={engine!r} is not a broker engine: use one of {', '.join(ENGINES)}")
    return engine


def local_broker(
    engine: str | None = None,
    *,
    port: int | None = None,
    nodes: int = 1,
    data_dir: str | None = None,
    log_path: str | None = None,
) -> KafkaCluster | TansuBroker:
    """A broker on 127.0.0.1, not started yet: `with local_broker() as b: b.bootstrap_servers`.
    Apache Kafka keeps its logs in `data_dir` (a temporary directory, removed at stop, if none);
    the fallback keeps nothing and runs one node only."""
    engine = engine or default_engine()
    if engine == "tansu":
        if nodes != 1 or data_dir is not None:
            raise ValueError(
                "the tansu fallback broker is one memory-only node: it takes neither --nodes nor "
                "--data-dir (use --engine kafka)"
            )
        return TansuBroker(port=port, log_path=log_path)
    return KafkaCluster(nodes=nodes, data_dir=data_dir, port=port)


# How long `ordo broker` waits for a broker of the same data directory that is still
# stopping (its launcher was killed, its node shuts down) to let go of the port.
PREVIOUS_BROKER_GRACE = 60.0
# A node of a cluster that exits is started again, unless it exited this many times, each
# within this many seconds of its start: it fails at start-up, and the others serve on.
NODE_FAST_EXIT_S = 30.0
NODE_FAST_EXITS = 3


def _port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on the port, or holds it bound. SO_REUSEADDR as Kafka
    binds: the sockets of connections closed by a broker that just stopped (TIME-WAIT)
    do not keep a new one off its port for a minute."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _serve_on_node_loss(cluster: KafkaCluster, stop_requested: threading.Event) -> None:
    """Until a stop is asked or every node is gone: a node that exits is started again,
    each in one line, while the others serve on (replication is for exactly this). A node
    that keeps failing at start-up is given up, also in one line."""
    started = {node.node_id: time.monotonic() for node in cluster.nodes}
    fast_exits = dict.fromkeys(started, 0)
    given_up: set[int] = set()
    while not stop_requested.wait(0.5):
        for node in cluster.nodes:
            if node.node_id in given_up or node.is_running():
                continue
            code = node.process.returncode if node.process is not None else None
            serving = sum(other.is_running() for other in cluster.nodes)
            fast = time.monotonic() - started[node.node_id] < NODE_FAST_EXIT_S
            fast_exits[node.node_id] = fast_exits[node.node_id] + 1 if fast else 0
            if fast_exits[node.node_id] >= NODE_FAST_EXITS:
                given_up.add(node.node_id)
                print(
                    f"ordo broker: Kafka node {node.node_id} ({node.address}) exited {NODE_FAST_EXITS} times within "
                    f"{NODE_FAST_EXIT_S:.0f} s of starting (code {code}; its log: {node.log_path}); not restarting "
                    f"it, {serving} node(s) serve on",
                    flush=True,
                )
                continue
            print(
                f"ordo broker: Kafka node {node.node_id} ({node.address}) exited (code {code}); restarting it, "
                f"{serving} node(s) serve on",
                flush=True,
            )
            node.start()
            started[node.node_id] = time.monotonic()
        if len(given_up) == len(cluster.nodes):
            return


def run_broker_foreground(
    port: int | None, engine: str | None = None, nodes: int = 1, data_dir: str | None = None
) -> int:
    """`ordo broker`: serve until SIGINT/SIGTERM, then stop cleanly. Problems it can name
    (no Java, a taken port, a data directory of another cluster) are one line, exit 2."""
    stop_requested = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop_requested.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    broker = None
    try:
        engine = engine or default_engine()
        if port is not None and _port_taken(port) and data_dir is not None and node_still_running(data_dir):
            print(
                f"ordo broker: the previous broker on {data_dir} is still stopping; waiting up to "
                f"{PREVIOUS_BROKER_GRACE:.0f} s for it to free port {port}",
                flush=True,
            )
            deadline = time.monotonic() + PREVIOUS_BROKER_GRACE
            while node_still_running(data_dir) and time.monotonic() < deadline and not stop_requested.is_set():
                stop_requested.wait(0.2)
        if port is not None and _port_taken(port):
            print(
                f"ordo broker: port {port} on 127.0.0.1 is in use (another broker?): stop that process or "
                f"choose another --port",
                flush=True,
            )
            return 2
        broker = local_broker(engine, port=port, nodes=nodes, data_dir=data_dir)
        address = broker.start()
        if engine == "tansu":
            print(
                f"broker listening on {address} (tansu, memory only: everything is gone when it stops; "
                f"stop with Ctrl-C)",
                flush=True,
            )
        else:
            print(
                f"broker listening on {address} (Apache Kafka {KAFKA_VERSION}, {nodes} node(s), data in "
                f"{broker.data_dir}; stop with Ctrl-C)",
                flush=True,
            )
        if isinstance(broker, KafkaCluster) and len(broker.nodes) > 1:
            _serve_on_node_loss(broker, stop_requested)
        while not stop_requested.is_set() and broker.is_running():
            stop_requested.wait(0.5)
        if not stop_requested.is_set():
            print(f"ordo broker: the broker exited on its own; its log says:\n{broker.log_tail()}", flush=True)
            return 1
        return 0
    except (MissingTool, MissingExtra, ValueError) as exc:
        print(f"ordo broker: {exc}", flush=True)
        return 2
    except RuntimeError as exc:
        print(f"ordo broker: {str(exc).splitlines()[0]}", flush=True)
        return 1
    finally:
        if broker is not None:
            broker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
