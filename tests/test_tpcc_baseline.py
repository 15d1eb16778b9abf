"""The PostgreSQL baseline of TPC-C runs the same procedures as the engine, one
SERIALIZABLE transaction per request, and leaves a state that keeps the consistency
conditions."""

import pytest

from ordo.benchmarks.baseline import BaselineUnavailable, PostgresServer
from ordo.benchmarks.tpcc_baseline import run_tpcc_baseline
from ordo.client import Client
from ordo.procedures.workloads import tpcc
from ordo.broker.topics import ensure_topics

pytestmark = pytest.mark.slow


def test_baseline_runs_the_tpcc_procedures_and_keeps_the_conditions(broker, namespace):
    try:
        server = PostgresServer(install=True).start()
    except BaselineUnavailable as exc:
        pytest.skip(f"PostgreSQL baseline unavailable: {exc}")
    try:
        requests = list(
            tpcc.generate(
                300,
                seed=2,
                warehouses=2,
                customers=30,
                items=200,
                payment=0.43,
                order_status=0.04,
                delivery=0.04,
                stock_level=0.04,
            )
        )
        loads = sum(1 for r in requests if r["proc"].startswith("tpcc_load_"))
        ensure_topics(broker, namespace, request_partitions=1)
        client = Client(broker, namespace)
        client.submit(requests)
        client.close()
        result = run_tpcc_baseline(broker, namespace, requests, loads, server)
    finally:
        server.stop()
    assert result["conditions"] == []
    assert result["txns"] == 300 and sum(result["statuses"].values()) == 300
    assert set(result["statuses"]) <= {"committed", "aborted"} and result["statuses"]["committed"] > 280
