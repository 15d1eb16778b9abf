"""`--metrics-port`: a Prometheus endpoint on 127.0.0.1, scraped with a real HTTP GET and
parsed with prometheus-client's own parser; figures from the workers' statuses, Ray
actors included. The progress line says the requests-topic lag and is quiet when idle."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ordo.client import Client
from ordo.broker.topics import ensure_topics
from tests.helpers import ROOT, stop

pytestmark = pytest.mark.slow


def scrape(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def value(families: dict, family: str, sample: str, **labels) -> float:
    found = [
        s.value for s in families[family] if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (family, sample, labels, families.get(family))
    return found[0]


@pytest.mark.parametrize("partitions", [1, 2])
def test_metrics_endpoint_reports_the_engine(broker, namespace, tmp_path, partitions):
    ensure_topics(broker, namespace)
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "run",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--data-dir",
            str(tmp_path / "d"),
            "--partitions",
            str(partitions),
            "--metrics-port",
            "0",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"},
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in engine.stderr], daemon=True).start()
    try:
        port = None
        deadline = time.monotonic() + 120
        while port is None:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line.startswith("metrics on http://127.0.0.1:"):
                port = int(line.split(":")[2].split("/")[0])
        assert "ordo_serving" in scrape(port)  # 0 or already 1: the first status poll may have come
        while not line.startswith("ordo serving: "):  # said once the pipeline is up, before any request
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        assert value(scrape(port), "ordo_serving", "ordo_serving") == 1
        deposits = [
            {
                "id": f"d{i}",
                "proc": "sl_deposit",
                "args": {"account": i, "asset": i, "account_amount": 5, "asset_amount": 5},
            }
            for i in range(30)
        ]
        transfers = [
            {
                "id": f"t{i}",
                "proc": "sl_transfer",
                "args": {
                    "src_account": 1000 + i,
                    "dst_account": i,
                    "src_asset": 1000 + i,
                    "dst_asset": i,
                    "account_amount": 1,
                    "asset_amount": 1,
                },
            }
            for i in range(5)
        ]  # from empty accounts: aborted
        # Dependent requests: each takes its reconnaissance pass, which is not a restart, then
        # aborts (the alias was never bound).
        dependent = [
            {"id": f"a{i}", "proc": "alias_deposit", "args": {"alias": f"nobody-{i}", "amount": 1}} for i in range(3)
        ]
        with Client(broker, namespace) as client:
            sent = client.submit(deposits + transfers + dependent + [{"id": "bad", "proc": "nope", "args": {}}])
            found = client.wait(sent, timeout=120)
        assert len(found) == 39

        deadline = time.monotonic() + 30
        while True:  # the endpoint shows what the workers reported at the coordinator's last poll;
            # outcomes are counted once published, batches once applied (after the broker's ack)
            families = scrape(port)
            decided = sum(
                value(families, "ordo_transactions", "ordo_transactions_total", status=status)
                for status in ("committed", "aborted", "rejected")
            )
            if decided == 39 and value(families, "ordo_batches", "ordo_batches_total") >= 1:
                break
            assert time.monotonic() < deadline, families["ordo_transactions"]
            time.sleep(0.5)
        assert value(families, "ordo_transactions", "ordo_transactions_total", status="committed") == 30
        assert value(families, "ordo_transactions", "ordo_transactions_total", status="aborted") == 8
        assert value(families, "ordo_transactions", "ordo_transactions_total", status="rejected") == 1
        assert "ordo_aborts" not in families and value(families, "ordo_restarts", "ordo_restarts_total") == 0
        assert value(families, "ordo_reconnaissance_passes", "ordo_reconnaissance_passes_total") == 3
        assert {sample.labels["status"] for sample in families["ordo_transactions"]} == {
            "committed",
            "aborted",
            "rejected",
        }
        batches = value(families, "ordo_batches", "ordo_batches_total")
        assert batches >= 1 and value(families, "ordo_last_applied_batch", "ordo_last_applied_batch") >= batches
        for p in range(partitions):
            assert value(families, "ordo_worker_busy_seconds", "ordo_worker_busy_seconds_total", partition=str(p)) > 0
        per_partition = sum(
            value(
                families,
                "ordo_partition_transactions",
                "ordo_partition_transactions_total",
                partition=str(p),
                status="committed",
            )
            for p in range(partitions)
        )
        assert per_partition == 30
        observed = value(families, "ordo_batch_latency_seconds", "ordo_batch_latency_seconds_count")
        assert observed >= batches * partitions
        assert value(families, "ordo_batch_latency_seconds", "ordo_batch_latency_seconds_bucket", le="+Inf") == observed
        assert value(families, "ordo_batch_latency_seconds", "ordo_batch_latency_seconds_sum") > 0
        assert value(families, "ordo_requests_lag_messages", "ordo_requests_lag_messages") >= 0
        assert "ordo_log_lag_records" in families
        assert value(families, "ordo_sequencer_restarts", "ordo_sequencer_restarts_total") == 0
        for p in range(partitions):  # each worker's process and its shard's RocksDB memory
            assert (
                value(
                    families,
                    "ordo_partition_memory_bytes",
                    "ordo_partition_memory_bytes",
                    partition=str(p),
                    kind="resident",
                )
                > 20 * 2**20
            )
            assert (
                value(
                    families,
                    "ordo_partition_memory_bytes",
                    "ordo_partition_memory_bytes",
                    partition=str(p),
                    kind="memtables",
                )
                > 0
            )

        # Progress lines while there was work, with the requests lag; none once idle.
        time.sleep(3)
        busy = []
        while not lines.empty():
            busy.append(lines.get())
        assert any(line.startswith("batch ") and "| requests lag " in line for line in busy), busy
        time.sleep(4)
        idle = []
        while not lines.empty():
            idle.append(lines.get())
        assert idle == [], idle
        # The line that stays on screen says nothing waits: an engine at the end of the log
        # reads log lag 0, as the endpoint does.
        last = [line for line in busy if line.startswith("batch ")][-1]
        assert last.rstrip().endswith("| log lag 0 | requests lag 0"), busy
        families = scrape(port)
        assert value(families, "ordo_log_lag_records", "ordo_log_lag_records") == 0
        assert value(families, "ordo_requests_lag_messages", "ordo_requests_lag_messages") == 0
    finally:
        assert stop(engine) == 0


def test_a_busy_metrics_port_is_one_clear_line(broker, namespace, tmp_path):
    import socket

    ensure_topics(broker, namespace)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "ordo.cli",
                "execute",
                "--bootstrap-servers",
                broker,
                "--namespace",
                namespace,
                "--data-dir",
                str(tmp_path / "d"),
                "--runtime",
                "local",
                "--metrics-port",
                str(port),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(f"ordo execute: cannot serve metrics on 127.0.0.1:{port}")


def test_the_engine_serves_once_every_worker_has_executed_what_the_log_held_before_its_start():
    import io

    from ordo.readiness import Readiness, read_past

    assert not read_past([], 5)
    assert not read_past([{"next_offset": 6}, {"next_offset": 5}], 5)  # one worker has not read the start record
    assert read_past([{"next_offset": 6}, {"next_offset": 9}], 5)

    def worker(next_offset: int, executed: int, read_ahead: int) -> dict:
        return {"next_offset": next_offset, "executed": executed, "read_batch": executed + read_ahead}

    stream = io.StringIO()
    readiness = Readiness(log_end_before_start=900, started=time.monotonic(), stream=stream)
    readiness.check([worker(400, 100, 50), worker(901, 200, 250)])  # one has not read the backlog yet
    assert stream.getvalue() == ""
    readiness.check([worker(905, 300, 150), worker(906, 400, 50)])  # both have read it: batches 1-450
    assert stream.getvalue() == (
        "ordo catching up: 150 batch(es) of the log's backlog are executed first (up to "
        "batch 450); requests sent now are answered after them\n"
    )
    readiness.check([worker(960, 449, 30), worker(960, 460, 10)])  # still batch 450 to go on one worker
    assert readiness.since is None and "serving" not in stream.getvalue()
    readiness.check([worker(990, 450, 40), worker(990, 470, 20)])
    assert readiness.since is not None and stream.getvalue().splitlines()[-1].startswith("ordo serving: ")

    at_the_end = io.StringIO()  # nothing to catch up on: serving, with no other line
    Readiness(log_end_before_start=10, started=time.monotonic(), stream=at_the_end).check([worker(12, 4, 0)])
    assert at_the_end.getvalue().startswith("ordo serving: ")


def test_the_progress_line_names_the_batch_its_outcomes_have_reached(broker, namespace, tmp_path):
    """Outcomes are counted once a batch is executed; it is applied once the broker has
    acknowledged its outputs, a pipeline later. The line's batch is the one its counts reached."""
    import io

    from ordo.scheduler.coordinator import Coordinator
    from ordo.progress import Progress

    ensure_topics(broker, namespace)
    coordinator = Coordinator(broker, namespace, str(tmp_path / "d"), "serial", 1)
    try:
        # A worker's status as it reports it one second into a backlog: 12 batches executed,
        # their outputs not yet acknowledged, so none applied.
        coordinator._update(
            [
                {
                    "partition": 0,
                    "executed": 12,
                    "applied": 0,
                    "committed": 2550,
                    "aborted": 5,
                    "rejected": 2,
                    "applied_txns": 0,
                    "next_offset": 14,
                    "checkpointed": [],
                }
            ]
        )
        stream = io.StringIO()
        Progress(coordinator, stream=stream, every=0.0)(coordinator.stats)
    finally:
        coordinator.stop()
        coordinator.run()
    line = stream.getvalue()
    assert line.startswith("batch 12 | 2557 txns ("), line
    assert "committed 2550 aborted 5 rejected 2" in line


def test_the_line_left_on_screen_shows_the_log_read_to_its_end(broker, namespace, tmp_path):
    """A line printed while log records still waited (a batch cut after the outcomes it
    counted, a sequencer's start record and snapshot, which carry no outcomes) is followed by
    one more once the workers have read the log to its end, so the engine falls quiet on
    `log lag 0`, not on the lag of a moment before."""
    import io

    from ordo.scheduler.coordinator import Coordinator
    from ordo.progress import Progress
    from tests.helpers import sequence_requests

    requests = [{"id": f"d{i}", "proc": "micro_rmw", "args": {"keys": [i]}} for i in range(5)]
    last_batch, _ = sequence_requests(broker, namespace, requests)
    coordinator = Coordinator(broker, namespace, str(tmp_path / "d"), "serial", 1)
    end = coordinator.log_end(timeout=10)

    def worker_read_up_to(position: int) -> None:  # a worker's status as the coordinator polls it
        coordinator._statuses = [
            {
                "partition": 0,
                "executed": last_batch,
                "applied": last_batch,
                "committed": 5,
                "aborted": 0,
                "rejected": 0,
                "applied_txns": 5,
                "next_offset": position,
                "position": position,
                "checkpointed": [],
            }
        ]
        coordinator._update(coordinator._statuses)

    stream = io.StringIO()
    try:
        progress = Progress(coordinator, stream=stream, every=0.0)
        worker_read_up_to(end - 2)  # the outcomes counted, a record and its marker still unread
        progress(coordinator.stats)
        worker_read_up_to(end)  # read to the end: nothing moved, nothing waits
        progress(coordinator.stats)
        progress(coordinator.stats)  # idle: quiet
    finally:
        coordinator.stop()
        coordinator.run()
    lines = stream.getvalue().splitlines()
    assert [line.rsplit("| ", 1)[1] for line in lines] == ["log lag 2", "log lag 0"], lines


def test_a_new_data_directory_serves_once_the_backlog_is_executed(broker, namespace, tmp_path):
    """`ordo run` on a new data directory against a log with a backlog: `ordo serving`
    comes once every batch the log held is executed (after `ordo catching up: N batch(es)`
    when its workers read that backlog with the sequencer's start record), so the outcomes of
    the whole backlog are counted when it comes, and a request sent then waits on nothing."""
    from tests.helpers import sequence_requests

    # More batches than a worker reads at once (1000 records): the last of them are read with
    # the start record of the sequencer `ordo run` starts, while the first are executed.
    backlog = [{"id": f"b{i}", "proc": "micro_rmw", "args": {"keys": [i % 40, 40 + i % 7]}} for i in range(2700)]
    last_batch, _ = sequence_requests(broker, namespace, backlog, max_txns=1, partitions=2)
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "run",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--data-dir",
            str(tmp_path / "new"),
            "--partitions",
            "2",
            "--metrics-port",
            "0",
            "--quiet",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"},
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in engine.stderr], daemon=True).start()
    try:
        said, port = [], None
        deadline = time.monotonic() + 360  # Ray's start and the backlog, on a busy 2-core machine
        while not said or not said[-1].startswith("ordo serving: "):
            try:
                said.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"no `ordo serving` within 360 s; ordo run said: {said}") from None
            if said[-1].startswith("metrics on http://127.0.0.1:"):
                port = int(said[-1].split(":")[2].split("/")[0])
        families = scrape(port)
        decided = sum(
            value(families, "ordo_transactions", "ordo_transactions_total", status=status)
            for status in ("committed", "aborted", "rejected")
        )
        assert decided == len(backlog), said
        catching_up = [line for line in said if line.startswith("ordo catching up: ")]
        for line in catching_up:  # no request came since: the backlog ends at the log's last batch
            assert 0 < int(line.split()[3].replace(",", "")) <= last_batch, line
            assert f"(up to batch {last_batch})" in line, line
        print(f"\n{last_batch} batches of backlog: {catching_up} then {said[-1].strip()}")
    finally:
        assert stop(engine, timeout=60) == 0


def test_every_metric_the_engine_serves_is_in_the_guide_s_table():
    """Each family the collector yields with every optional part present (the lags, the
    sequencer's restarts, the readiness), by the name a scrape shows, is a row of
    docs/running.md's metrics table, and each row one it serves."""
    import re
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest

    from ordo.metrics import EngineCollector
    from ordo.scheduler.coordinator import EngineStats

    coordinator = SimpleNamespace(statuses=[{"partition": 0}], stats=EngineStats(), silences=list)
    lags = SimpleNamespace(log=0, requests=0)
    readiness = SimpleNamespace(since=None)
    registry = CollectorRegistry()
    registry.register(EngineCollector(coordinator, lags, sequencer_restarts=lambda: 0, readiness=readiness))
    served = dict(re.findall(r"^# TYPE (\S+) (\S+)$", generate_latest(registry).decode(), re.MULTILINE))

    with open(os.path.join(ROOT, "docs", "running.md")) as f:
        rows = re.findall(r"^\| `(ordo_\w+)(?:\{[\w,]+\})?` \| (\w+) \|", f.read(), re.MULTILINE)
    assert dict(rows) == served, (set(served) - set(dict(rows)), set(dict(rows)) - set(served))
