"""Dependent transactions through the whole pipeline, where their reconnaissance and
restarts actually loop (requests -> sequencer -> engine -> requests). `ordo bench alias`:
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


class Pipeline:
    """Sequencer (a child process), engine (a thread of this process; Ray workers with 2+
    partitions) and a client on a fresh namespace of a running broker."""

    def __init__(self, bootstrap: str, kind: str, scheduler: str, partitions: int, max_txns: int, directory: str):
        from ordo.client import Client
        from ordo.services import SequencerProcess
        from ordo.scheduler.coordinator import Coordinator
        from ordo.benchmarks.requests import ordering_of
        from ordo.sequencer.sequencer import SequencerConfig
        from ordo.broker.topics import ensure_topics

        self.namespace = new_namespace(kind)
        ensure_topics(bootstrap, self.namespace, request_partitions=1)
        self.coordinator = Coordinator(bootstrap, self.namespace, directory, scheduler, partitions)
        self.sequencer = SequencerProcess(
            bootstrap,
            self.namespace,
            SequencerConfig(max_txns=max_txns, partitions=partitions, ordering=ordering_of(scheduler)),
        )
        self.client = Client(bootstrap, self.namespace)
        self.errors: list[BaseException] = []
        self._engine = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        try:
            self.coordinator.run()
        except BaseException as exc:
            self.errors.append(exc)

    def __enter__(self) -> "Pipeline":
        self.sequencer.start()
        self._engine.start()
        return self

    def run(self, requests: list[dict], rate: float | None = None, timeout: float = 600) -> tuple[dict, float]:
        """Send `requests` and wait for every outcome: (outcome by id, seconds)."""
        started = time.monotonic()
        ids = _send(self.client, requests, rate)
        outcomes = self.client.wait(ids, timeout=timeout)
        elapsed = time.monotonic() - started
        if self.errors:
            raise RuntimeError(f"engine failed: {self.errors[0]!r}") from self.errors[0]
        if len(outcomes) < len(requests):
            raise RuntimeError(f"{len(requests) - len(outcomes)} requests got no outcome within {timeout:.0f} s")
        return outcomes, elapsed

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.coordinator.stop()
        self._engine.join(120)
        self.sequencer.stop()


def restart_figures(requests: list[dict], outcomes: dict) -> dict[str, Any]:
    """How often the dependent requests among `requests` were restarted."""
    from ordo.procedures.registry import default_registry

    procedures = default_registry().procedures
    dependent = [outcomes[r["id"]] for r in requests if procedures[r["proc"]].reconnoiter is not None]
    restarted = [o for o in dependent if o.get("restarts", 0) > 0]
    return {
        "dependent": len(dependent),
        "restarted": len(restarted),
        "restart_rate": round(len(restarted) / max(1, len(dependent)), 4),
        "restarts": sum(o.get("restarts", 0) for o in dependent),
        "rejected_by_bound": sum(1 for o in dependent if o["status"] == "rejected"),
    }


def run_alias(
    scheduler: str,
    partitions: int,
    txns: int,
    seed: int,
    knobs: dict,
    max_txns: int,
    json_path: str | None = None,
    rate: float | None = None,
) -> dict[str, Any]:
    """`rate`: requests/s the client sends at (None: all at once). Restarts depend on how
    many rebinds fall between a transaction's reconnaissance and its turn, so on how long
    that is: in a burst the reconnaissance result waits behind the whole backlog."""
    from ordo.broker.local import local_broker

    requests = workload_requests("alias", txns, seed, knobs, partitions)
    root = tempfile.mkdtemp(prefix="ordo-alias-")
    try:
        with local_broker() as broker:
            with Pipeline(
                broker.bootstrap_servers, "alias", scheduler, partitions, max_txns, os.path.join(root, "data")
            ) as pipeline:
                outcomes, elapsed = pipeline.run(requests, rate)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutdown_ray()
    report = {
        "workload": "alias",
        "scheduler": scheduler,
        "partitions": partitions,
        "txns": txns,
        "knobs": knobs,
        "rate": rate,
        "batch_size": max_txns,
        "machine": machine(),
        "end_to_end_tps": round(len(requests) / elapsed),
        "statuses": dict(Counter(o["status"] for o in outcomes.values())),
        **restart_figures(requests, outcomes),
    }
    print(
        f"alias {knobs or ''} | {scheduler} | {partitions} partition(s) | {txns:,} requests "
        f"({'all at once' if rate is None else f'{rate:,.0f}/s'}), {report['dependent']:,} deposits and transfers"
    )
    print(f"  end to end {report['end_to_end_tps']:,} req/s (each deposit or transfer passes the log twice)")
    print(
        f"  restarted {report['restarted']:,} of {report['dependent']:,} ({100 * report['restart_rate']:.2f} %), "
        f"{report['restarts']:,} restarts in all, {report['rejected_by_bound']} rejected at the bound"
    )
    print(f"  outcomes {report['statuses']}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2)
    return report


def _send(client, requests: list[dict], rate: float | None) -> list[str]:
    if rate is None:
        return client.submit(requests)
    ids: list[str] = []
    # A slice every 50 ms: each submit ends in a flush, so each slice is one producer batch,
    # and the local broker stalls on a topic of many small batches (docs/local-broker.md).
    step = max(1, int(rate / 20))
    started = time.monotonic()
    for first in range(0, len(requests), step):
        wait = started + first / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        ids += client.submit(requests[first : first + step])
    return ids
