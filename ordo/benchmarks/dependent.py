"""`ordo bench alias`: dependent transactions through the whole pipeline, where their
reconnaissance and restarts actually loop (requests -> sequencer -> engine -> requests):
end-to-end throughput, and how often transactions were restarted because a binding changed
before their turn. A pre-filled log cannot measure this: nothing would re-sequence them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from typing import Any

from ordo.benchmarks.machine import machine
from ordo.benchmarks.prefill import new_namespace
from ordo.benchmarks.requests import workload_requests
from ordo.benchmarks.runners import shutdown_ray


def run_alias(scheduler: str, partitions: int, txns: int, seed: int, knobs: dict, max_txns: int,
              json_path: str | None = None, rate: float | None = None) -> dict[str, Any]:
    """`rate`: requests/s the client sends at (None: all at once). Restarts depend on how
    many rebinds fall between a transaction's reconnaissance and its turn, so on how long
    that is: in a burst the reconnaissance result waits behind the whole backlog."""
    from ordo.client import Client
    from ordo.services import SequencerProcess
    from scheduler.coordinator import Coordinator
    from sequencer.broker import LocalBroker
    from sequencer.sequencer import SequencerConfig
    from sequencer.topics import ensure_topics

    requests = workload_requests("alias", txns, seed, knobs, partitions)
    root = tempfile.mkdtemp(prefix="ordo-alias-")
    errors: list[BaseException] = []
    try:
        with LocalBroker() as broker:
            bootstrap = broker.bootstrap_servers
            namespace = new_namespace("alias")
            ensure_topics(bootstrap, namespace, request_partitions=1)
            coordinator = Coordinator(bootstrap, namespace, os.path.join(root, "data"), scheduler, partitions)
            sequencer = SequencerProcess(bootstrap, namespace,
                                         SequencerConfig(max_txns=max_txns, partitions=partitions))

            def serve() -> None:
                try:
                    coordinator.run()
                except BaseException as exc:
                    errors.append(exc)

            engine = threading.Thread(target=serve, daemon=True)
            sequencer.start()
            engine.start()
            client = Client(bootstrap, namespace)
            try:
                started = time.monotonic()
                ids = _send(client, requests, rate)
                outcomes = client.wait(ids, timeout=600)
                elapsed = time.monotonic() - started
            finally:
                client.close()
                coordinator.stop()
                engine.join(120)
                sequencer.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutdown_ray()
    if errors:
        raise RuntimeError(f"engine failed: {errors[0]!r}") from errors[0]
    if len(outcomes) < len(requests):
        raise RuntimeError(f"{len(requests) - len(outcomes)} requests got no outcome within 600 s")
    dependent = [o for r, o in zip(requests, (outcomes[r["id"]] for r in requests))
                 if r["proc"] != "alias_bind"]
    restarted = [o for o in dependent if o.get("restarts", 0) > 0]
    report = {
        "workload": "alias", "scheduler": scheduler, "partitions": partitions, "txns": txns, "knobs": knobs,
        "rate": rate,
        "batch_size": max_txns, "machine": machine(),
        "end_to_end_tps": round(len(requests) / elapsed),
        "statuses": dict(Counter(o["status"] for o in outcomes.values())),
        "dependent": len(dependent),
        "restarted": len(restarted),
        "restart_rate": round(len(restarted) / max(1, len(dependent)), 4),
        "restarts": sum(o.get("restarts", 0) for o in dependent),
        "rejected_by_bound": sum(1 for o in dependent if o["status"] == "rejected"),
    }
    print(f"alias {knobs or ''} | {scheduler} | {partitions} partition(s) | {txns:,} requests "
          f"({'all at once' if rate is None else f'{rate:,.0f}/s'}), {len(dependent):,} deposits and transfers")
    print(f"  end to end {report['end_to_end_tps']:,} req/s (each deposit or transfer passes the log twice)")
    print(f"  restarted {report['restarted']:,} of {report['dependent']:,} ({100 * report['restart_rate']:.2f} %), "
          f"{report['restarts']:,} restarts in all, {report['rejected_by_bound']} rejected at the bound")
    print(f"  outcomes {report['statuses']}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2)
    return report


def _send(client, requests: list[dict], rate: float | None) -> list[str]:
    if rate is None:
        return client.submit(requests)
    ids: list[str] = []
    step = max(1, int(rate / 100))  # a slice every 10 ms
    started = time.monotonic()
    for first in range(0, len(requests), step):
        wait = started + first / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        ids += client.submit(requests[first:first + step])
    return ids
