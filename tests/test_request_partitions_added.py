"""Partitions added to `<ns>.requests` while the engine runs (producers scaled out) are read:
every request on them is answered once, and nothing waits unread."""

from __future__ import annotations

import subprocess
import threading
import time

from confluent_kafka.admin import AdminClient, NewPartitions

from ordo.client import Client
from ordo.broker.lag import requests_lag
from tests.helpers import ordo, read_results, stop


def _deposits(prefix: str, count: int) -> list[dict]:
    return [
        {
            "id": f"{prefix}-{i}",
            "proc": "sl_deposit",
            "args": {"account": i, "asset": i, "account_amount": 1, "asset_amount": 1},
        }
        for i in range(count)
    ]


def test_request_partitions_raised_from_one_to_three_under_load_are_all_read(broker, namespace, tmp_path, fault_report):
    engine = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path / "d"),
        "--runtime",
        "local",
        "--quiet",
        stderr=subprocess.PIPE,
        text=True,
    )
    before, during, after = _deposits("before", 200), _deposits("during", 200), _deposits("after", 200)
    try:
        with Client(broker, namespace) as client:
            client.wait_for_topics(timeout=60)
            client.submit(before)
            # Their outcomes: the sequencer has started on one partition before any is added.
            read_results(broker, f"{namespace}.results", len(before), timeout=120)

            def feed() -> None:  # load while the partitions are added, from a producer that predates them
                for start in range(0, len(during), 20):
                    client.submit(during[start : start + 20])
                    time.sleep(0.1)

            feeder = threading.Thread(target=feed)
            feeder.start()
            admin = AdminClient({"bootstrap.servers": broker})
            (future,) = admin.create_partitions([NewPartitions(f"{namespace}.requests", 3)]).values()
            future.result(30)
            feeder.join(60)
        with Client(broker, namespace) as fresh:  # a producer that sees three partitions from its start
            fresh.submit(after)
        requests = before + during + after
        records = read_results(broker, f"{namespace}.results", len(requests), timeout=120)
        ids = [record["id"] for record in records]
        assert sorted(set(ids)) == sorted(r["id"] for r in requests), f"{len(set(ids))} of {len(requests)} answered"
        assert len(ids) == len(set(ids)), "a request answered twice"
        assert all(record["status"] == "committed" for record in records)
        deadline = time.monotonic() + 30
        while requests_lag(broker, namespace) != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert requests_lag(broker, namespace) == 0
        assert engine.poll() is None
    finally:
        stop(engine)
    said = engine.stderr.read()
    assert "Traceback" not in said and "takes the new partition(s) 1, 2 too" in said, said
    fault_report(
        f"{namespace}.requests raised from 1 to 3 partitions while requests were fed: "
        f"{len(requests)} requests, each answered once, requests lag 0"
    )
