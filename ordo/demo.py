"""`ordo demo`: the whole pipeline on this machine with a readable summary."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time

from ordo.client import Client
from ordo.embedded import read_log
from ordo.services import SequencerProcess
from ordo.state import digest, records
from procedures.registry import default_registry
from procedures.workloads import ALL_WORKLOADS
from scheduler.coordinator import Coordinator
from scheduler.reference import SerialInterpreter
from sequencer.broker import local_broker
from sequencer.log import ARIA
from sequencer.sequencer import SequencerConfig
from sequencer.topics import ensure_topics
from storage.digest import to_hex

BAD_REQUESTS = [
    ("demo-bad-json", b'{"id": "demo-bad-json", "proc": "sl_deposit", "args": {'),
    ("demo-unknown", json.dumps({"id": "demo-unknown", "proc": "no_such_procedure", "args": {}}).encode()),
    ("demo-bad-args", json.dumps({"id": "demo-bad-args", "proc": "sl_deposit", "args": {
        "account": "three", "asset": 1, "account_amount": 5, "asset_amount": 5}}).encode()),
]


def run_demo(workload: str, count: int, scheduler: str, partitions: int, data_dir: str | None) -> int:
    module = ALL_WORKLOADS[workload]
    own_dir = data_dir is None
    data_dir = data_dir or tempfile.mkdtemp(prefix="ordo-demo-")
    namespace = "demo"
    say = lambda text="": print(text, flush=True)  # noqa: E731
    say(f"Ordo demo: {count:,} {workload} requests, {scheduler} scheduler, {partitions} partition(s)")
    with local_broker() as broker:
        bootstrap = broker.bootstrap_servers
        say(f"  broker     {bootstrap} (local, memory only)")
        say(f"  data       {data_dir}")
        ensure_topics(bootstrap, namespace, request_partitions=2)
        coordinator = Coordinator(bootstrap, namespace, data_dir, scheduler, partitions)
        sequencer = SequencerProcess(bootstrap, namespace, SequencerConfig(partitions=partitions, ordering=ARIA if scheduler == ARIA else None))
        sequencer.start()
        requests = list(module.generate(count, seed=7))
        requests.append(dict(requests[0]))  # a duplicate id
        expected = len(requests) + len(BAD_REQUESTS)

        def stop_when_done(stats):
            if stats.txns >= expected:
                coordinator.stop()

        client = Client(bootstrap, namespace)
        started = time.monotonic()
        feeder = threading.Thread(target=lambda: client.submit(requests + BAD_REQUESTS), daemon=True)
        feeder.start()
        stats = coordinator.run(progress=stop_when_done, idle_exit=120)
        elapsed = time.monotonic() - started
        feeder.join()
        sequencer.stop()
        client.close()
        say(f"  outcomes   {stats.txns:,} of {expected:,} in {elapsed:.1f} s "
            f"({stats.txns / elapsed:,.0f} requests/s end to end), {stats.batches} batches")
        say(f"             committed {stats.committed:,}, aborted {stats.aborted:,}, rejected {stats.rejected:,}")
        outcomes = client.outcomes(["demo-bad-json", "demo-unknown", "demo-bad-args", requests[0]["id"]], 30)
        for request_id in ["demo-bad-json", "demo-unknown", "demo-bad-args"]:
            outcome = outcomes.get(request_id, {})
            say(f"  rejected   {request_id}: {outcome.get('error')}")
        say("  duplicate  a second request with id "
            f"{requests[0]['id']!r} was rejected: {stats.rejected >= 4}")
        state_digest, applied = digest(data_dir)
        reference = SerialInterpreter(default_registry()).apply(read_log(bootstrap, namespace, applied))
        same = reference.digest() == state_digest
        say(f"  digest     {to_hex(state_digest)} (through batch {applied})")
        say(f"  check      plain serial interpretation of the log gives the same state: {'yes' if same else 'NO'}")
        sample = [r for _, r in zip(range(3), records(data_dir))]
        for record in sample:
            say(f"  record     {json.dumps(record)}")
        if workload == "voter":
            from ordo.benchmarks.voter import leaderboards

            boards = leaderboards(data_dir)
            for name in ("top3", "bottom3", "trending3"):
                shown = ", ".join(f"#{c} ({boards['votes'].get(c, 0)} votes)" for c in boards[name] or [])
                say(f"  {name:<10} {shown}")
            say(f"  removed    {', '.join(f'#{c}' for c in boards['removed']) or 'none yet'}")
    if own_dir:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0 if same and stats.txns == expected else 1
