"""The procedure-set fingerprint a sequencer writes in its start record and every engine
checks (procedures/fingerprint.py): the same in every process for every kind of procedure,
and a procedure set that could not describe itself the same way is refused up front."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from ordo.testing import TestEngine
from ordo.procedures.args import Int
from ordo.procedures.contract import Procedure
from ordo.procedures.fingerprint import by_value, describe
from ordo.procedures.registry import Registry
from ordo.procedures.streams import BatchField, Stream, Window
from ordo.broker.topics import ensure_topics
from tests.helpers import ROOT, ordo, read_results, stop

MODULES = ("tests.every_kind_procedures", "tests.stream_procedures")


def _described_in_a_fresh_process(hash_seed: str) -> dict:
    code = (
        "import json, sys; from ordo.procedures.fingerprint import describe; "
        "from ordo.procedures.loading import load_registry; from ordo.procedures.registry import default_registry; "
        f"print(json.dumps([describe(load_registry({MODULES!r})), describe(default_registry())]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT, "PYTHONHASHSEED": hash_seed},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_every_kind_of_procedure_describes_itself_the_same_in_every_process():
    first, second = _described_in_a_fresh_process("1"), _described_in_a_fresh_process("2")
    assert first == second
    assert {"kind_restock", "kind_restock_named", "kind_receive"} <= set(first[0]["procedures"])
    assert first[1]["procedures"]["voter_vote"]


def test_a_dataflow_s_shape_is_part_of_its_input_procedure_s_fingerprint():
    def registry(rows: int) -> Registry:
        procedures = [
            Procedure("src", {"v": Int()}, lambda a: ((), ()), lambda ctx, a: None),
            Procedure("dst", {}, lambda a: ((), ()), lambda ctx, b: None),
        ]
        streams = [Stream("s", producers=["src"], consumers=["dst"]), Window("w", owner="dst", rows=rows, slide=1)]
        built = Registry()
        built.add_workload([], procedures, streams)
        return built

    assert describe(registry(3))["procedures"]["src"] != describe(registry(4))["procedures"]["src"]
    assert describe(registry(3)) == describe(registry(3))


def test_by_value_matches_repr_where_repr_is_by_value_and_names_functions_by_path():
    schema = sorted({"a": Int(0, 5), "b": BatchField({"x": Int()})}.items())
    assert (
        by_value(schema) == "[('a', Int(min=0, max=5)), ('b', BatchField(schema={'x': Int(min="
        f"{Int().min}, max={Int().max})}}))]"
    )
    assert by_value((1,)) == repr((1,)) and by_value({"k": [1, "x", None]}) == repr({"k": [1, "x", None]})
    assert by_value(_helper) == f"{__name__}._helper"
    assert by_value(frozenset({"b", "a"})) == by_value(frozenset({"a", "b"}))


def _helper():
    pass


class _Opaque:
    def check(self, name, value):
        return value


def test_a_schema_without_a_description_by_value_is_refused_by_the_test_engine():
    def registry(field) -> Registry:
        built = Registry()
        built.add_procedure(Procedure("odd", {"v": field}, lambda a: ((), ()), lambda ctx, a: None))
        return built

    with pytest.raises(ValueError) as refused:
        TestEngine(registry(_Opaque()))
    assert str(refused.value) == (
        "procedure 'odd': its argument schema cannot be compared across processes: "
        "_Opaque has no description by value (make it a dataclass)"
    )

    @dataclass(frozen=True)
    class Described(_Opaque):
        limit: int = 3

    with TestEngine(registry(Described())) as engine:
        assert engine.call("odd", {"v": 1})["status"] == "committed"


@pytest.mark.slow
def test_a_sequencer_and_an_engine_in_separate_processes_run_every_kind_of_procedure(broker, namespace, tmp_path):
    ensure_topics(broker, namespace, request_partitions=1)
    kafka = ("--bootstrap-servers", broker, "--namespace", namespace, "--procedures", "tests.every_kind_procedures")
    requests = [
        {"id": "plain", "proc": "kind_restock", "args": {"item": 1, "qty": 5}},
        {"id": "name", "proc": "kind_name_item", "args": {"name": "bolt", "item": 2}},
        {"id": "batch", "proc": "kind_receive", "args": {"batch": [{"item": 1, "qty": 2}, {"item": 3, "qty": 4}]}},
    ]
    sequencer = ordo("sequence", *kafka, "--max-txns", "5")
    engine = ordo("execute", *kafka, "--data-dir", str(tmp_path / "d"), "--quiet")
    try:
        from ordo.client import Client

        with Client(broker, namespace) as client:
            client.submit(requests)
            client.wait([r["id"] for r in requests], timeout=120)
            client.submit([{"id": "named", "proc": "kind_restock_named", "args": {"name": "bolt", "qty": 3}}])
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # a dependent request: restarted first, then decided
                records = read_results(broker, f"{namespace}.results", len(requests) + 1)
                if sum(r["status"] != "restarted" for r in records) == len(requests) + 1:
                    break
                time.sleep(0.5)
        assert engine.poll() is None and sequencer.poll() is None
    finally:
        assert stop(engine) == 0
        stop(sequencer)
    final = {r["id"]: r for r in records if r["status"] != "restarted"}
    assert {i: r["status"] for i, r in final.items()} == dict.fromkeys(["plain", "name", "batch", "named"], "committed")
    assert final["batch"]["result"] == 2
    assert [s["proc"] for s in final["batch"]["steps"]] == ["kind_count", "kind_audit"]


def test_ordo_run_refuses_such_a_schema_in_one_line_before_it_starts(tmp_path):
    (tmp_path / "opaque_app.py").write_text(
        "from ordo.procedures.contract import Procedure\n"
        "class Odd:\n"
        "    def check(self, name, value):\n"
        "        return value\n"
        "PROCEDURES = [Procedure('odd', {'v': Odd()}, lambda a: ((), ()), lambda ctx, a: None)]\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "run",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--procedures",
            "opaque_app",
            "--data-dir",
            str(tmp_path / "d"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "ordo run: procedure 'odd': its argument schema cannot be compared across "
        "processes: Odd has no description by value (make it a dataclass)"
    ]
