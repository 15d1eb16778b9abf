"""Ordo as a Kafka citizen: a Node.js client written as a user writes one (KafkaJS from npm,
no codec plugin, tests/node/client.js) submits requests, reads their outcomes and an output
stream's tuples from what `ordo run` writes with its default settings, and makes a live read
of the state; what it sends and reads matches docs/wire-format.schema.json, and so do the
reads and answers the engine's own code makes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import jsonschema
import pytest

from ordo.broker.topics import ensure_topics
from ordo.scheduler.reads import Read, ReadServer, Refused, answer_bytes, parse_read, parse_reads, refusal
from ordo.storage.keys import encode_key
from ordo.storage.partitioning import Partitioner
from ordo.storage.rocks import RocksShard
from ordo.storage.values import encode_value
from tests.helpers import ROOT, stop

NODE_DIR = os.path.join(ROOT, "tests", "node")


def wire_format(definition: str) -> jsonschema.Draft202012Validator:
    """A validator of one of docs/wire-format.schema.json's definitions."""
    with open(os.path.join(ROOT, "docs", "wire-format.schema.json")) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator({**schema, "$ref": f"#/$defs/{definition}"})


@pytest.fixture(scope="module")
def node_client() -> str:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are not installed")
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "kafkajs")):
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr
    return os.path.join(NODE_DIR, "client.js")


@pytest.mark.slow
def test_a_kafkajs_client_submits_and_reads_outcomes_a_stream_and_the_state(broker, namespace, tmp_path, node_client):
    ensure_topics(broker, namespace, request_partitions=2)
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
            str(tmp_path / "d"),
            "--app",
            "inventory:app",
            "--runtime",
            "local",
            "--partitions",
            "2",
            "--quiet",
        ],
        cwd=os.path.join(ROOT, "examples"),
        env=env,
    )
    steps = [
        [{"id": "js-deliver", "proc": "deliver", "args": {"batch": [{"warehouse": 1, "item": 7, "qty": 12}]}}],
        [
            {"id": "js-ship", "proc": "ship", "args": {"warehouse": 1, "item": 7, "qty": 5}},
            {"id": "js-bad", "proc": "ship", "args": {"warehouse": 1, "item": 7}},
        ],
    ]
    # stock is placed by warehouse: warehouse 1's item 7 and warehouse 2's (never written) lie
    # on different partitions of the two, so the read has two parts.
    live_read = {"table": "stock", "keys": [[1, 7], [2, 7]]}
    try:
        done = subprocess.run(
            ["node", node_client, broker, namespace, "low_stock", json.dumps(steps), json.dumps(live_read)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
    finally:
        assert stop(engine) == 0
    read = json.loads(done.stdout.strip().splitlines()[-1])
    outcomes = read["outcomes"]
    assert (outcomes["js-deliver"]["status"], outcomes["js-deliver"]["result"]) == ("committed", 1)
    assert (outcomes["js-ship"]["status"], outcomes["js-ship"]["result"]) == ("committed", 7)
    assert outcomes["js-bad"]["status"] == "rejected" and "missing argument(s): qty" in outcomes["js-bad"]["error"]
    assert read["streamed"] == [{"warehouse": 1, "item": 7, "left": 7}]

    # The live read, at least as of the ship's batch: 7 left, and the default 0 where nothing
    # was delivered, every part at one batch.
    assert read["read"]["values"] == [[[1, 7], 7], [[2, 7], 0]]
    assert read["read"]["batch"] >= outcomes["js-ship"]["batch"]
    requests, answers = read["read_requests"], read["read_answers"]
    assert requests[0] == {"id": requests[0]["id"], **live_read, "at_least": outcomes["js-ship"]["batch"]}
    for request in requests:
        wire_format("read_request").validate(request)
    for answer in answers:
        wire_format("read_answer").validate(answer)
    assert {answer["id"] for answer in answers} <= {request["id"] for request in requests}
    assert all(answer["parts"] == [0, 1] and "values" in answer for answer in answers)
    last = {answer["partition"]: answer for answer in answers}
    assert sorted(last) == [0, 1] and {answer["batch"] for answer in last.values()} == {read["read"]["batch"]}
    assert {tuple(key): value for answer in last.values() for key, value in answer["values"]} == {(1, 7): 7, (2, 7): 0}


def test_the_wire_format_schema_describes_the_reads_and_answers_the_engine_makes(tmp_path):
    """docs/wire-format.schema.json's read_request takes what a worker serves and refuses
    what it refuses, and its read_answer every answer the worker's code sends: of keys, of a
    scan, and errors."""
    requests, answers = wire_format("read_request"), wire_format("read_answer")
    tables = {"stock": object(), "sku": object()}
    partitioner = Partitioner(2, component_tables={"stock": 0})
    served = [
        {"id": "keys", "table": "stock", "keys": [[1, 7], [2, 7], [3, -(2**63)]]},
        {"id": "one", "table": "sku", "keys": ["bolt"], "at_least": 3, "timeout_ms": 120_000},
        {"id": "again", "table": "stock", "keys": [[1, 7]], "at_least": 3, "partitions": [1], "after_offset": 12},
        {"id": "scan", "table": "stock", "scan": {"prefix": [1], "after": None, "limit": 1}},
        {"id": "all", "table": "stock", "scan": {"prefix": None, "after": [1, 7]}},
        {"id": "bare", "table": "sku", "scan": {}},
    ]
    refused = [
        {"id": "both", "table": "stock", "keys": [[1, 7]], "scan": {}},
        {"id": "neither", "table": "stock"},
        {"id": "empty", "table": "stock", "keys": []},
        {"id": "wide", "table": "stock", "keys": [2**63]},
        {"id": "float", "table": "stock", "keys": [1.5]},
        {"id": "nested", "table": "stock", "keys": [[1, [7]]]},
        {"id": "prefix", "table": "stock", "scan": {"prefix": []}},
        {"id": "limit", "table": "stock", "scan": {"limit": 0}},
        {"id": "rows", "table": "stock", "scan": {"limit": 10_001}},
        {"id": "waits", "table": "stock", "keys": [1], "timeout_ms": 0},
        {"id": "past", "table": "stock", "keys": [1], "at_least": -1},
        {"id": "parts", "table": "stock", "keys": [1], "partitions": "0"},
    ]
    for body in served:
        requests.validate(body)
        assert isinstance(parse_read(json.dumps(body).encode(), 0, tables, partitioner), Read), body
    for body in refused:
        assert not requests.is_valid(body), body
        assert isinstance(parse_read(json.dumps(body).encode(), 0, tables, partitioner), Refused), body
    assert not requests.is_valid({"table": "stock", "keys": [1]})  # no id: not answered at all
    assert parse_read(b'{"table": "stock", "keys": [1]}', 0, tables, partitioner) is None

    # A worker's answers, as its ReadServer makes and sends them, from a shard at batch 3.
    sent: list[dict] = []
    with RocksShard(str(tmp_path / "shard")) as shard:
        writes = {encode_key("stock", (1, 7)): encode_value(7), encode_key("stock", (1, 8)): encode_value({"n": [1]})}
        shard.apply_batch(
            {**writes, encode_key("sku", "bolt"): encode_value(7)}, {"batch": 3, "cursor": {"time_ms": 5}}
        )
        for partition in (0, 1):
            server = ReadServer.__new__(ReadServer)  # its answers, without its thread and Kafka
            server.worker = type("Worker", (), {"shard": shard, "defaults": {"stock": 0, "sku": None}})()
            server.partition, server.served, server._behind, server._send = partition, 0, lambda: 2, sent.append
            for body in served:
                read = parse_read(json.dumps(body).encode(), 0, tables, partitioner)
                assert isinstance(read, Read)
                if partition in read.parts and (read.asked is None or partition in read.asked):
                    server._answer([read])
        broken = parse_read(b'{"id": "broken", "table": "sku", "keys": ["bolt"]}', 0, tables, partitioner)
        assert isinstance(broken, Read)
        shard.apply_batch({encode_key("sku", "bolt"): encode_value(b"\xff")}, {"batch": 4, "cursor": {"time_ms": 6}})
        server.partition = broken.parts[0]
        server._answer([broken])  # a value JSON cannot carry: an error answer
    sent.append(refusal("neither", 0, 'a read names either "keys" or "scan"'))
    sent.append(refusal("late", 1, "partition 1 had not applied batch 9 within the read's timeout", (0, 1)))
    wire = [json.loads(answer_bytes(answer)) for answer in sent]
    for answer in wire:
        answers.validate(answer)
    kinds = {answer["id"]: next(k for k in ("values", "rows", "error") if k in answer) for answer in wire}
    assert kinds == {
        **{"keys": "values", "one": "values", "again": "values", "scan": "rows", "all": "rows", "bare": "rows"},
        **{"broken": "error", "neither": "error", "late": "error"},
    }
    assert [a["values"] for a in wire if a["id"] == "keys" and a["partition"] == 1] == [
        [[[1, 7], 7], [[3, -(2**63)], 0]]
    ]
    assert [(a["rows"], a["more"]) for a in wire if a["id"] == "scan"] == [([[[1, 7], 7]], True)]
    assert all(a["behind"] == 2 and a["batch"] == 3 and a["time_ms"] == 5 for a in wire if "error" not in a)
    for bad in [
        {"id": "x", "partition": 0, "parts": [0], "batch": 3, "time_ms": 5, "values": []},  # no behind
        {"id": "x", "partition": 0, "parts": [0], "batch": 3, "time_ms": 5, "behind": 0, "rows": []},  # no more
        {"id": "x", "partition": 0, "parts": [0], "batch": 3, "time_ms": 5, "behind": 0, "values": [], "error": "e"},
        {"id": "x", "partition": 0, "parts": [], "error": "e"},
        {"id": "x", "partition": 0, "parts": [0], "batch": 3, "time_ms": 5, "behind": 0, "values": [[1]]},
    ]:
        assert not answers.is_valid(bad), bad

    # Reads gathered in one record, and a worker's answers to them gathered under its key.
    gathered = {"reads": served[:3]}
    wire_format("read_requests").validate(gathered)
    assert not wire_format("read_requests").is_valid({"reads": []})
    reads = parse_reads(json.dumps(gathered).encode(), 0, tables, partitioner, b"g-1")
    assert [read.id for read in reads] == ["keys", "one", "again"] and {read.group for read in reads} == {b"g-1"}
    single = parse_reads(json.dumps(served[0]).encode(), 0, tables, partitioner, b"keys")
    assert [read.group for read in single] == [None]
    wire_format("read_answers").validate({"answers": wire[:3]})
    assert not wire_format("read_answers").is_valid({"answers": [{"id": "x"}]})
