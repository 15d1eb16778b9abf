"""Dependent transactions across engine crashes, at a steady rate: `ordo run` serves the
alias workload while it is SIGKILLed and started again a few times, and the outcomes say
how many transactions were rejected because the values they depend on kept changing
before their turn (docs/ollp.md). Run from the repository root, against a running broker:

    python -m ordo.benchmarks.alias_kills --bootstrap-servers 127.0.0.1:9092 --rate 800 --seconds 25 --kills 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter

RESTART_LIMIT_REASON = "changed before its turn"


def start_engine(bootstrap: str, namespace: str, data_dir: str, log, partitions: int) -> subprocess.Popen:
    from ordo.lifeline import stop_with_owner

    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "run",
            "--bootstrap-servers",
            bootstrap,
            "--namespace",
            namespace,
            "--data-dir",
            data_dir,
            "--partitions",
            str(partitions),
            "--quiet",
            "--workloads",
            "alias",
        ],
        stdout=log,
        stderr=log,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    stop_with_owner([engine.pid])  # its sequencer and its Ray go with it
    return engine


def wait_serving(log_path: str, seen: int, timeout: float = 120) -> int:
    """Wait for the engine's `n`-th "ordo serving" line; returns how many there are."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path) as f:
            count = f.read().count("ordo serving")
        if count > seen:
            return count
        time.sleep(0.1)
    raise TimeoutError("the engine did not start serving")


def send_paced(client, requests: list[dict], rate: float, sent: list[str]) -> None:
    started = time.monotonic()
    step = max(1, int(rate / 50))  # 50 sends a second
    for i in range(0, len(requests), step):
        delay = started + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        sent.extend(client.submit(requests[i : i + step]))


def measure(
    bootstrap: str, rate: float, seconds: float, kills: int, seed: int, partitions: int = 1, down: float = 0.0
) -> dict:
    """`down`: seconds the engine stays down after each kill before it is started again."""
    from ordo.client import Client
    from ordo.procedures.workloads import alias
    from ordo.broker.topics import ensure_topics

    namespace = f"alias-kills-{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, namespace)
    requests = list(alias.generate(int(rate * seconds), seed))
    with tempfile.TemporaryDirectory(prefix="ordo-alias-kills-") as directory:
        data_dir, log_path = os.path.join(directory, "data"), os.path.join(directory, "engine.log")
        with open(log_path, "w") as log, Client(bootstrap, namespace) as client:
            engine = start_engine(bootstrap, namespace, data_dir, log, partitions)
            serving = wait_serving(log_path, 0)
            sent: list[str] = []
            sender = threading.Thread(target=send_paced, args=(client, requests, rate, sent), daemon=True)
            started = time.monotonic()
            sender.start()
            for k in range(kills):
                time.sleep(max(0.0, started + seconds * (k + 1) / (kills + 1) - time.monotonic()))
                engine.send_signal(signal.SIGKILL)
                engine.wait()
                time.sleep(down)
                engine = start_engine(bootstrap, namespace, data_dir, log, partitions)
                serving = wait_serving(log_path, serving)
            sender.join()
            try:
                outcomes = client.wait(sent, timeout=600)
            finally:
                engine.send_signal(signal.SIGTERM)
                engine.wait(60)
    statuses = Counter(o["status"] for o in outcomes.values())
    storm = sum(1 for o in outcomes.values() if RESTART_LIMIT_REASON in (o.get("error") or ""))
    restarts = Counter(o.get("restarts", 0) for o in outcomes.values())
    return {
        "rate": rate,
        "seconds": seconds,
        "kills": kills,
        "down": down,
        "partitions": partitions,
        "seed": seed,
        "requests": len(requests),
        "outcomes": len(outcomes),
        "statuses": dict(statuses),
        "rejected_restart_limit": storm,
        "rejected_restart_limit_share": storm / max(1, len(outcomes)),
        "max_restarts": max(restarts) if restarts else 0,
        "restarts": dict(sorted(restarts.items())),
        "rejected_examples": [o["error"] for o in outcomes.values() if RESTART_LIMIT_REASON in (o.get("error") or "")][
            :3
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--rate", type=float, default=800.0)
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--down", type=float, default=0.0, help="seconds down after each kill")
    args = parser.parse_args(argv)
    print(
        json.dumps(
            measure(args.bootstrap_servers, args.rate, args.seconds, args.kills, args.seed, args.partitions, args.down)
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
