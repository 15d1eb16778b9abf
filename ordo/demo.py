"""`ordo demo`: the whole pipeline on this machine, told in plain words: what was sent, what
the engine did with it and why, and what the final check proved."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter

from ordo.client import Client
from ordo.embedded import read_log
from ordo.services import SequencerProcess
from ordo.state import digest, records
from ordo.procedures.registry import default_registry
from ordo.procedures.streams import is_internal_table
from ordo.procedures.workloads import ALL_WORKLOADS, summary
from ordo.scheduler.coordinator import Coordinator
from ordo.scheduler.reference import SerialInterpreter
from ordo.broker.local import local_broker
from ordo.log.records import ARIA
from ordo.sequencer.sequencer import SequencerConfig
from ordo.broker.topics import ensure_topics
from ordo.storage.digest import to_hex

BAD_REQUESTS = [
    ("demo-bad-json", b'{"id": "demo-bad-json", "proc": "sl_deposit", "args": {'),
    ("demo-unknown", json.dumps({"id": "demo-unknown", "proc": "no_such_procedure", "args": {}}).encode()),
    (
        "demo-bad-args",
        json.dumps(
            {
                "id": "demo-bad-args",
                "proc": "sl_deposit",
                "args": {"account": "three", "asset": 1, "account_amount": 5, "asset_amount": 5},
            }
        ).encode(),
    ),
]
NEXT = (
    "Next: your own app — README.md, 'Quick start' (examples/bank.py under `ordo run --app bank:app`); "
    "or this demo on another scheduler: ordo demo --scheduler vll --partitions 2"
)


def say(text: str = "") -> None:
    print(text, flush=True)


class _Interrupt:
    """Ctrl-C (SIGINT) or SIGTERM: stop the engine at the end of its batch, then clean up."""

    def __init__(self, coordinator: Coordinator):
        self.coordinator = coordinator
        self.signal: int | None = None
        self._previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _stop(self, signum, frame) -> None:
        self.signal = signum
        self.coordinator.stop()

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def demo_requests(module, count: int) -> list[dict]:
    """The workload's requests for `--count N` (N of them; TPC-C's come after the ones that
    fill its tables), then a second request under the first one's id."""
    requests = list(module.generate(count, seed=7))
    requests.append(dict(requests[0]))  # a duplicate id
    return requests


def intro(requests: list[dict], workload: str, scheduler: str, partitions: int) -> str:
    """The demo's first count: every message it sends, as "What happened" counts them."""
    generated = len(requests) - 1
    return (
        f"{generated + 1 + len(BAD_REQUESTS):,} requests — {generated:,} of workload {workload}, a second one "
        f"under the first one's id and {len(BAD_REQUESTS)} malformed ones — run by the {scheduler} scheduler "
        f"on {partitions} partition(s)."
    )


def run_demo(workload: str, count: int, scheduler: str, partitions: int, data_dir: str | None) -> int:
    module = ALL_WORKLOADS[workload]
    own_dir = data_dir is None
    data_dir = data_dir or tempfile.mkdtemp(prefix="ordo-demo-")
    namespace = "demo"
    requests = demo_requests(module, count)
    say(f"Ordo demo — {summary(module)}")
    say(intro(requests, workload, scheduler, partitions))
    try:
        with local_broker() as broker:
            return _run(module, workload, requests, scheduler, partitions, data_dir, namespace, broker)
    finally:
        if own_dir:
            shutil.rmtree(data_dir, ignore_errors=True)


def _run(
    module, workload: str, requests: list[dict], scheduler: str, partitions: int, data_dir: str, namespace: str, broker
) -> int:
    bootstrap = broker.bootstrap_servers
    say()
    say("What runs")
    say(f"  A Kafka broker on {bootstrap} keeps the log; the engine keeps its state in {data_dir}.")
    say(f"  A client sends them to {namespace}.requests, the copy of the first and the malformed ones last.")
    say(
        f"  The sequencer cuts them into numbered batches on {namespace}.log; the engine executes every batch "
        f"and publishes each request's outcome on {namespace}.results."
    )
    ensure_topics(bootstrap, namespace, request_partitions=2)
    coordinator = Coordinator(bootstrap, namespace, data_dir, scheduler, partitions)
    interrupt = _Interrupt(coordinator)
    ordering = ARIA if scheduler == ARIA else None  # aria's order is stamped in the log by the sequencer
    sequencer = SequencerProcess(
        bootstrap, namespace, SequencerConfig(partitions=partitions, ordering=ordering), quiet=True
    )
    client = Client(bootstrap, namespace)
    try:
        sequencer.start()
        expected = len(requests) + len(BAD_REQUESTS)

        def stop_when_done(stats):
            if stats.txns >= expected:
                coordinator.stop()

        started = time.monotonic()
        sent: list[str] = []  # the ids outcomes carry: a bad request's may be its position
        feeder = threading.Thread(target=lambda: sent.extend(client.submit(requests + BAD_REQUESTS)), daemon=True)
        feeder.start()
        stats = coordinator.run(progress=stop_when_done, idle_exit=120)
        elapsed = time.monotonic() - started
        if interrupt.signal is not None:
            say()
            say(
                f"Stopped by {signal.Signals(interrupt.signal).name} after {stats.txns:,} of {expected:,} "
                f"outcomes (batch {stats.last_batch}); the broker, the sequencer and the demo's files are removed."
            )
            return 130
        feeder.join(30)
    finally:
        sequencer.stop()
        client.close()
        interrupt.restore()
    return _tell(
        module,
        requests,
        sent[-len(BAD_REQUESTS) :],
        expected,
        stats,
        elapsed,
        client,
        bootstrap,
        namespace,
        data_dir,
        workload,
    )


def _tell(
    module,
    requests: list,
    bad_ids: list[str],
    expected: int,
    stats,
    elapsed: float,
    client: Client,
    bootstrap: str,
    namespace: str,
    data_dir: str,
    workload: str,
) -> int:
    """`bad_ids`: the ids the outcomes of BAD_REQUESTS carry (a message that is not a
    request is answered under its position)."""
    ids = [r["id"] for r in requests[:-1]] + bad_ids
    # Read before the summary is printed, so nothing the client logs lands inside it.
    found = client.collect(ids + [requests[0]["id"]], timeout=60, from_beginning=True)
    say()
    say(
        f"What happened ({elapsed:.1f} s, {stats.txns / elapsed:,.0f} requests/s end to end, {stats.batches:,} batches)"
    )
    say(
        f"  {stats.txns:,} of {expected:,} requests answered: {stats.committed:,} committed, {stats.aborted:,} "
        f"aborted, {stats.rejected:,} rejected."
    )
    outcomes = [o for request_id in dict.fromkeys(ids) for o in found.get(request_id, [])]
    reasons = Counter(o["error"] for o in outcomes if o.get("status") == "aborted")
    if reasons:
        say("  Aborted: the procedure ran and decided not to commit; nothing it wrote was kept. Why:")
        for reason, n in reasons.most_common(3):
            say(f"    {n:,} × {reason}")
        if len(reasons) > 3:
            say(
                f"    and {sum(reasons.values()) - sum(n for _, n in reasons.most_common(3)):,} for "
                f"{len(reasons) - 3} other reason(s)"
            )
    say("  Rejected: the request never ran (each one answered, the pipeline went on):")
    for (name, _), outcome_id in zip(BAD_REQUESTS, bad_ids):
        outcome = (found.get(outcome_id) or [{}])[0]
        say(f"    {name}: {outcome.get('error')}")
    copy = next((o for o in found.get(requests[0]["id"], []) if o.get("status") == "rejected"), {})
    say(f"    the second request with id {requests[0]['id']}: {copy.get('error', 'no answer yet')}")
    state_digest, applied = digest(data_dir)
    reference = SerialInterpreter(default_registry()).apply(read_log(bootstrap, namespace, applied))
    same = reference.digest() == state_digest
    say()
    say("What the check proved")
    if same:
        say(
            f"  Executing the logged requests one by one, in log order, from an empty state gives exactly the "
            f"state the engine built (digest {to_hex(state_digest)}, batches 1–{applied})."
        )
    else:
        say(
            f"  The engine's state DIFFERS from executing the logged requests one by one in log order "
            f"(through batch {applied}): please report this."
        )
    say("  Three of its records:")
    own = (r for r in records(data_dir) if not is_internal_table(r["table"]))  # as `ordo dump` shows them
    for _, record in zip(range(3), own):
        say(f"    {json.dumps(record)}")
    if workload == "voter":
        from ordo.benchmarks.voter import leaderboards

        boards = leaderboards(data_dir)
        for name in ("top3", "bottom3", "trending3"):
            shown = ", ".join(f"#{c} ({boards['votes'].get(c, 0)} votes)" for c in boards[name] or [])
            say(f"  {name:<10} {shown}")
        say(f"  removed    {', '.join(f'#{c}' for c in boards['removed']) or 'none yet'}")
    say()
    say(NEXT)
    return 0 if same and stats.txns == expected else 1
