"""examples/inventory.py, declared with the App API only (composite keys, an abort, a
dependent procedure, an input stream with atomic batches, a window, an output stream), run
through `ordo run` — its sequencer and its engine in separate processes, on two partitions —
with its outcomes, its state and its output stream checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ordo.client import Client
from ordo.broker.topics import ensure_topics
from tests.helpers import ROOT, stop, topic_reader

pytestmark = pytest.mark.slow
EXAMPLES = os.path.join(ROOT, "examples")


def _line(warehouse: int, item: int, qty: int) -> dict:
    return {"warehouse": warehouse, "item": item, "qty": qty}


STEPS = [  # each step's requests are decided before the next step is sent
    {"bind-bolt": ("name_sku", {"sku": "bolt", "item": 7}), "bind-nut": ("name_sku", {"sku": "nut", "item": 3})},
    {
        "delivery-1": ("deliver", {"batch": [_line(1, 7, 40), _line(2, 3, 5)]}),
        "delivery-2": ("deliver", {"batch": [_line(1, 3, 8)]}),
        "delivery-bad": ("deliver", {"batch": [_line(1, 7, 4), _line(1, 7, 0)]}),
    },
    {
        "ship-1": ("ship", {"warehouse": 1, "item": 7, "qty": 35}),
        "ship-2": ("ship", {"warehouse": 1, "item": 7, "qty": 35}),
        "ship-3": ("ship", {"warehouse": 1, "item": 3, "qty": 2}),
    },
    {
        "restock-bolt": ("restock_sku", {"warehouse": 1, "sku": "bolt", "qty": 10}),
        "restock-washer": ("restock_sku", {"warehouse": 1, "sku": "washer", "qty": 1}),
    },
]

EXPECTED = {
    "bind-bolt": ("committed", None, None),
    "bind-nut": ("committed", None, None),
    "delivery-1": ("committed", 2, None),
    "delivery-2": ("committed", 1, None),
    "delivery-bad": ("rejected", None, "deliver: batch[1]: argument 'qty': 0 outside [1, 10000]"),
    "ship-1": ("committed", 5, None),
    "ship-2": ("aborted", None, "only 5 of item 7 in warehouse 1"),
    "ship-3": ("committed", 6, None),
    "restock-bolt": ("committed", 15, None),
    "restock-washer": ("aborted", None, "unknown SKU 'washer'"),
}


def test_the_inventory_example_runs_end_to_end_through_ordo_run(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=1)
    data_dir = str(tmp_path / "d")
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
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
            data_dir,
            "--app",
            "inventory:app",
            "--partitions",
            "2",
            "--runtime",
            "local",
            "--quiet",
        ],
        cwd=EXAMPLES,
        env=env,
    )
    outcomes = {}
    try:
        with Client(broker, namespace) as client:
            for step in STEPS:
                ids = [client.submit(proc, args, request_id=request_id) for request_id, (proc, args) in step.items()]
                outcomes.update(client.wait(ids, timeout=120))
                assert set(outcomes) >= set(ids), f"no outcome for {set(ids) - set(outcomes)}"
        assert engine.poll() is None
    finally:
        assert stop(engine) == 0
    assert {i: (o["status"], o["result"], o["error"]) for i, o in outcomes.items()} == EXPECTED
    assert outcomes["restock-bolt"]["restarts"] == 0  # decided at the first step after reconnaissance
    assert [s["proc"] for s in outcomes["delivery-1"]["steps"]] == ["tally"]

    dumped = subprocess.run(
        [sys.executable, "-m", "ordo.cli", "dump", "--data-dir", data_dir, "--internal"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    state = {(r["table"], json.dumps(r["key"])): r["value"] for r in map(json.loads, dumped.splitlines())}
    assert state == {
        ("sku", '"bolt"'): 7,
        ("sku", '"nut"'): 3,
        ("stock", "[1, 7]"): 15,
        ("stock", "[2, 3]"): 5,
        ("stock", "[1, 3]"): 6,
        ("delivered", "1"): 48,
        ("delivered", "2"): 5,
        ("low", "1"): 2,
        ("window.recent", "0"): {"rows": [[1, 40], [2, 5], [1, 8]]},
        ("window.recent", "3"): 0,  # no tuple staged since the last slide
        ("stream.low_stock", "0"): [{"item": 3, "left": 6, "warehouse": 1}],
    }
    consumer = topic_reader(broker, f"{namespace}.stream.low_stock", consumer_timeout_ms=2000)
    alerts = [json.loads(m.value) for m in consumer]
    consumer.close()
    assert alerts == [{"warehouse": 1, "item": 7, "left": 5}, {"warehouse": 1, "item": 3, "left": 6}]
