"""`ordo spark produce --app/--workloads`: argument types come from the procedures, not from
the data. Columns of --args-cols are read as text and each cell is cast on the executors to
the type of its procedure's argument (spark_jobs/records.py, cast_cell); a cell that does not
cast goes as its text, so the engine rejects that row alone. `--wait` counts the outcomes.

The casting itself is pure and tested without Spark; the job against the real broker, a real
engine (`ordo run` of tests/typed_app.py) and local Spark, through the CLI."""

from __future__ import annotations

import argparse
import csv

import pytest

from ordo.client import Client
from ordo.procedures.args import Int, Optional
from ordo.procedures.contract import Procedure
from ordo.procedures.loading import load_registry
from ordo.procedures.registry import Registry
from ordo.spark_jobs import producer_job
from ordo.spark_jobs.records import ARGUMENT_TYPES, cast_args, cast_cell, request_message
from tests.helpers import ordo, ordo_output, read_results, stop

TYPED_APP = "tests.typed_app:app"


@pytest.mark.parametrize(
    "text, type_name, sent",
    [
        ("100", "int", 100),
        (" -7 ", "int", -7),
        ("x", "int", "x"),
        ("1.5", "int", "1.5"),
        ("1_000", "int", "1_000"),  # Python's int() takes it; JSON spells no such number
        ("9" * 5000, "int", "9" * 5000),  # beyond what int() parses: the engine says why
        ("2.25", "float", 2.25),
        ("3", "float", 3),  # the engine takes it as 3.0
        ("1e3", "float", 1000.0),
        ("nan", "float", "nan"),
        ("1e999", "float", "1e999"),  # no infinity in JSON
        ("true", "bool", True),
        ("False", "bool", False),
        ("1", "bool", "1"),
        ("007", "str", "007"),  # a text stays a text, however it looks
        ('{"text": "ok"}', "object", {"text": "ok"}),
        ("[1, 2]", "object", "[1, 2]"),
        ('["a", 2]', "list", ["a", 2]),
        ("[NaN]", "list", "[NaN]"),
        ("12", "infer", 12),
        ("0.5", "infer", 0.5),
        ("true", "infer", True),
        ("abc", "infer", "abc"),
        ("5", "no such type", "5"),
    ],
)
def test_a_cell_is_cast_to_its_arguments_type_or_sent_as_its_text(text, type_name, sent):
    cast = cast_cell(text, type_name)
    assert cast == sent and type(cast) is type(sent)


def test_a_rows_arguments_are_cast_by_its_procedure_and_nothing_else_is_judged():
    types = {"add_line": {"cart": "int", "item": "str", "price": "float"}}
    row = {"cart": "4", "item": "12", "price": "x", "extra": "9"}
    assert cast_args("add_line", row, types) == {"cart": 4, "item": "12", "price": "x", "extra": "9"}
    assert cast_args("unknown", row, types) == row  # an unknown procedure: the engine says so
    assert cast_args("add_line", {"cart": 4}, types) == {"cart": 4}  # not text (Parquet): as it is
    assert cast_args("add_line", "not an object", types) == "not an object"
    assert request_message("r1", "add_line", '{"cart":"4","price":"x"}', types) == (
        b"r1",
        b'{"id":"r1","proc":"add_line","args":{"cart":4,"price":"x"}}',
    )
    # Without types, the message is what it always was.
    assert request_message("r1", "add_line", '{"cart":"4"}') == (
        b"r1",
        b'{"id":"r1","proc":"add_line","args":{"cart":"4"}}',
    )


def test_the_argument_types_of_an_app_are_plain_data_named_as_the_encoder_names_them():
    assert producer_job.argument_types(load_registry([TYPED_APP])) == {
        "add_line": {"cart": "int", "item": "str", "price": "float", "qty": "int", "gift": "bool", "tags": "list"},
        "annotate": {"cart": "int", "note": "object"},
    }

    class Odd:  # a field type of the user's own
        def check(self, name, value):
            return value

    registry = Registry()
    registry.add_procedure(
        Procedure("odd", {"v": Odd(), "n": Optional(Int())}, lambda a: ((), ()), lambda ctx, a: None)
    )
    assert producer_job.argument_types(registry) == {"odd": {"v": "infer", "n": "int"}}
    names = {t for types in producer_job.argument_types(load_registry([])).values() for t in types.values()}
    assert names <= set(ARGUMENT_TYPES)


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    producer_job.add_arguments(parser)
    return parser.parse_args(["--bootstrap-servers", "b:9092", "--input", "in.csv", *argv])


def test_app_and_workloads_are_taken_as_ordo_run_takes_them():
    assert producer_job.mapping_from(parsed("--args-cols", "a,b")).argument_types is None  # inferred, as before
    mapping = producer_job.mapping_from(parsed("--args-cols", "cart,item", "--app", TYPED_APP))
    assert mapping.argument_types is not None and mapping.argument_types["add_line"]["cart"] == "int"
    assert not mapping.infers_types
    mapping = producer_job.mapping_from(parsed("--args-cols", "account", "--workloads", "sl,micro"))
    assert mapping.argument_types is not None and set(mapping.argument_types) == {
        "sl_deposit",
        "sl_transfer",
        "micro_rmw",
    }
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        producer_job.mapping_from(parsed("--args-cols", "a", "--workloads", "nope"))
    with pytest.raises(ValueError, match="--app takes MODULE:APP"):
        producer_job.mapping_from(parsed("--args-cols", "a", "--app", "tests.typed_app"))
    with pytest.raises(ValueError, match="type the columns of --args-cols"):
        producer_job.mapping_from(parsed("--app", TYPED_APP))


def test_the_wait_summary_counts_each_row_and_names_the_first_rejections():
    assert producer_job.outcome_ids([("a", True, True), ("", True, True), ("b", False, True), ("a", True, True)]) == (
        ["a", "a"],
        2,
    )
    found = {
        "a": [{"id": "a", "status": "committed"}, {"id": "a", "status": "rejected", "error": "duplicate request id"}],
        "b": [{"id": "b", "status": "aborted"}],
    }
    assert producer_job.outcome_summary(["a", "a", "b", "c"], found, 1, 30) == [
        "outcomes: 1 committed, 1 aborted, 1 rejected, 1 without an outcome after 30 s, "
        "1 not waited for (no usable id, proc or args: answered by position)",
        "rejected a: duplicate request id",
    ]


# ---------------------------------------------------------------- the job, end to end

ROWS = 202
BAD_ROW = "line-117"  # its cart is "x": the one row the engine must reject


def typed_rows() -> list[dict]:
    """200 add_line rows (text that looks like a number for the Str item, an integer for the
    Float price, empty Optional cells), one annotate row (an Object from JSON text), one bad
    cell. Columns a row's procedure does not take are empty, so they are left out."""
    rows = []
    for i in range(ROWS - 1):
        rows.append(
            {
                "id": f"line-{i}",
                "proc": "add_line",
                "cart": str(i % 7),
                "item": "007" if i % 10 == 0 else f"item {i}",
                "price": str(i % 5) if i % 3 == 0 else f"{i % 9}.25",
                "qty": "" if i % 2 else str(1 + i % 4),
                "gift": ["", "true", "false"][i % 3],
            }
        )
    rows[117]["cart"] = "x"
    rows.append({"id": "note-1", "proc": "annotate", "cart": "3", "note": '{"text": "ok", "rating": 4.5}'})
    return rows


def write_csv(path, rows: list[dict]) -> None:
    columns = ["id", "proc", "cart", "item", "price", "qty", "gift", "note"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")
def test_one_bad_cell_is_one_rejected_row_and_every_other_row_commits(broker, namespace, tmp_path):
    rows = typed_rows()
    assert len(rows) == ROWS
    dataset = tmp_path / "lines.csv"
    write_csv(dataset, rows)
    engine = ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        str(tmp_path / "data"),
        "--app",
        TYPED_APP,
        "--runtime",
        "local",
        "--quiet",
    )
    try:
        with Client(broker, namespace) as client:
            client.wait_for_topics(timeout=120)
        out = ordo_output(
            "spark",
            "produce",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--input",
            str(dataset),
            "--format",
            "csv",
            "--master",
            "local[2]",
            "--args-cols",
            "cart,item,price,qty,gift,note",
            "--app",
            TYPED_APP,
            "--wait",
            "--wait-timeout",
            "180",
            "--progress-seconds",
            "0",
            timeout=600,
        )
        results = read_results(broker, f"{namespace}.results", ROWS)
    finally:
        assert stop(engine) == 0

    # What the engine answered, read with kafka-python (no code shared with the job).
    outcomes = {}
    for record in results:
        outcomes.setdefault(record["id"], record)  # an id's first outcome is its outcome
    assert set(outcomes) == {row["id"] for row in rows}
    rejected = {i: o["error"] for i, o in outcomes.items() if o["status"] != "committed"}
    assert rejected == {BAD_ROW: "add_line: argument 'cart': expected integer, got string"}
    assert all(type(o["result"]) is float for i, o in outcomes.items() if i.startswith("line-") and i != BAD_ROW)
    assert outcomes["note-1"]["result"] == {"text": "ok", "rating": 4.5, "extra": None}

    lines = out.splitlines()
    assert lines[0].startswith(f"published {ROWS} requests to {namespace}.requests"), out
    assert lines[1:] == [
        f"outcomes: {ROWS - 1} committed, 0 aborted, 1 rejected",
        f"rejected {BAD_ROW}: add_line: argument 'cart': expected integer, got string",
    ], out
