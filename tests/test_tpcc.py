"""TPC-C: the population loaded through the log and the five transactions. After a run on
2 partitions the consistency conditions 1-4, 8, 9 and 12 (clause 3.3.2) hold on `ordo
dump`, and re-executing the same log under every scheduler and partition count gives the
same state."""

import json

import pytest
from kafka import KafkaProducer

from ordo.procedures.registry import default_registry
from ordo.procedures.workloads import tpcc
from ordo.procedures.workloads.tpcc_consistency import violations
from ordo.broker.topics import ensure_topics
from tests.dependent_logs import assert_equals_serial_interpretation, assert_same_run, run_dependent
from tests.helpers import ordo, ordo_output, read_results, run_engine, stop

REGISTRY = default_registry()
SIZE = {"warehouses": 2, "customers": 30, "items": 200}
FULL_MIX = {"payment": 0.43, "order_status": 0.04, "delivery": 0.04, "stock_level": 0.04}


def _split(requests):
    loads = [r for r in requests if r["proc"].startswith("tpcc_load_")]
    return loads, [r for r in requests if not r["proc"].startswith("tpcc_load_")]


def _records(state: dict):
    return [
        {"table": table, "key": list(key) if type(key) is tuple else key, "value": value}
        for (table, key), value in state.items()
    ]


def test_generator_prints_the_load_first_then_the_mix():
    requests = list(tpcc.generate(2000, seed=3, **SIZE, **FULL_MIX))
    loads, mix = _split(requests)
    assert requests[: len(loads)] == loads and len(mix) == 2000
    assert len(loads) == 1 + 2 * (1 + 1 + tpcc.DISTRICTS)
    procs = [r["proc"] for r in mix]
    payments = [p for p in procs if p.startswith("tpcc_payment")]
    assert 0.38 < len(payments) / len(mix) < 0.48
    assert 0.5 < procs.count("tpcc_payment_name") / len(payments) < 0.7
    remote = [r for r in mix if r["proc"].startswith("tpcc_payment") and r["args"]["c_w"] != r["args"]["w"]]
    assert 0.1 < len(remote) / len(payments) < 0.2
    orders = [r for r in mix if r["proc"] == "tpcc_new_order"]
    assert all(5 <= len(r["args"]["items"]) <= 15 for r in orders)
    assert {"tpcc_delivery", "tpcc_stock_level", "tpcc_order_status", "tpcc_order_status_name"} <= set(procs)
    assert requests == list(tpcc.generate(2000, seed=3, **SIZE, **FULL_MIX))


def test_every_scheduler_and_partition_count_agrees_and_the_conditions_hold():
    loads, mix = _split(tpcc.generate(600, seed=7, **SIZE, **FULL_MIX))
    batches = [loads] + [mix[i : i + 60] for i in range(0, len(mix), 60)]
    first = None
    for scheduler in ("serial", "locking", "vll", "opchain"):
        for partitions in (1, 2, 3):
            run = run_dependent(batches, scheduler, partitions, REGISTRY)
            if first is None:
                first = run
                statuses = {(r["status"], r["error"]) for r in run["outcomes"]}
                assert statuses <= {("committed", None), ("aborted", "Item number is not valid")}
                assert violations(_records(run["state"])) == []
                assert_equals_serial_interpretation(run, REGISTRY)
                continue
            assert_same_run(run, first, (scheduler, partitions))


def test_the_checker_finds_broken_conditions():
    loads, mix = _split(tpcc.generate(100, seed=1, **SIZE))
    state = run_dependent([loads, mix], "serial", 1, REGISTRY)["state"]
    assert violations(_records(state)) == []
    broken = dict(state)
    broken[("warehouse", (1,))] = {**broken[("warehouse", (1,))], "w_ytd": 1}
    customer = broken[("customer", (2, 3, 4))]
    broken[("customer", (2, 3, 4))] = {**customer, "c_balance": customer["c_balance"] + 1}
    del broken[("order_line", (1, 1, 1, 1))]
    found = {line.split(":")[0] for line in violations(_records(broken))}
    assert found == {"1", "8", "4", "12"}


@pytest.mark.slow
def test_a_run_on_two_partitions_keeps_the_conditions_and_every_layout_replays_it(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=2)
    data_dir = str(tmp_path / "run")
    loads, mix = _split(tpcc.generate(500, seed=11, **SIZE, **FULL_MIX))
    engine = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data_dir,
        "--scheduler",
        "locking",
        "--partitions",
        "2",
        "--runtime",
        "local",
        "--max-txns",
        "100",
        "--quiet",
    )
    try:
        producer = KafkaProducer(bootstrap_servers=broker)
        for group in (loads, mix):  # the population first, then the transactions
            for request in group:
                producer.send(f"{namespace}.requests", key=request["id"].encode(), value=json.dumps(request).encode())
            producer.flush()
            records = read_results(
                broker, f"{namespace}.results", len(loads) if group is loads else len(loads) + len(mix), timeout=240
            )
        producer.close()
    finally:
        assert stop(engine) == 0
    by_id = {r["id"]: r for r in records}
    assert len(by_id) == len(records) == len(loads) + len(mix)
    assert all(r["status"] == "committed" for r in by_id.values() if r["id"] in {x["id"] for x in loads})
    assert {r["status"] for r in by_id.values()} <= {"committed", "aborted"}

    def dumped(directory):
        return [json.loads(line) for line in ordo_output("dump", "--data-dir", directory).splitlines()]

    state = dumped(data_dir)
    assert violations(state) == []
    assert any(type(r["key"]) is list and len(r["key"]) == 4 for r in state if r["table"] == "order_line")
    last_batch = max(r["batch"] for r in records)
    for scheduler in ("serial", "locking", "vll", "opchain"):
        for partitions in (1, 2):
            replay_dir = tmp_path / f"{scheduler}-{partitions}"
            run_engine(broker, namespace, last_batch, replay_dir, scheduler, partitions)
            assert dumped(str(replay_dir)) == state, (scheduler, partitions)


@pytest.mark.slow
def test_bench_tpcc_reports_engine_and_end_to_end_with_the_conditions(tmp_path):
    from ordo.benchmarks.tpcc import run_tpcc

    report = run_tpcc(
        [1], "vll", 400, 3, {"warehouses": 2, "customers": 30, "items": 200}, 50, str(tmp_path / "tpcc.json")
    )
    [run] = report["runs"]
    assert run["engine_tps"] > 0 and run["conditions"] == [] and run["timed_txns"] > 0
    e2e = run["end_to_end"]
    assert e2e["conditions"] == [] and e2e["txns"] == 400 and e2e["tps"] > 0
    assert e2e["dependent"] > 0 and e2e["rejected_by_bound"] == 0
    assert sum(e2e["statuses"].values()) == 400
