"""ordo.testing: a procedure author's tests run in-process, with no broker, through the
real partition workers and schedulers; check_deterministic catches a procedure whose
outcome depends on anything but its reads, its arguments and ctx."""

from __future__ import annotations

import itertools

import pytest

import ordo
from ordo.testing import TestEngine, check_deterministic
from ordo.procedures.args import Int


def bank() -> ordo.App:
    app = ordo.App("bank")
    app.table("account", default=100, partitioner="modulo")

    def keys(args):
        pair = [("account", args["src"]), ("account", args["dst"])]
        return pair, pair

    @app.procedure(args={"src": Int(0), "dst": Int(0), "amount": Int(1)}, analyze=keys)
    def transfer(ctx, args):
        balance = ctx.read("account", args["src"])
        if balance < args["amount"]:
            ctx.abort("insufficient funds")
        ctx.write("account", args["src"], balance - args["amount"])
        ctx.write("account", args["dst"], ctx.read("account", args["dst"]) + args["amount"])
        return balance - args["amount"]

    @app.procedure(args={"account": Int(0)})
    class peek:
        def analyze(args):
            return [("account", args["account"])], []

        def run(ctx, args):
            ctx.write("account", args["account"], 0)  # not declared: the transaction aborts

    return app


@pytest.mark.parametrize("scheduler, partitions", [("serial", 1), ("locking", 2), ("opchain", 2)])
def test_a_test_engine_runs_requests_as_the_pipeline_does(scheduler, partitions):
    with TestEngine(bank(), scheduler, partitions) as engine:
        assert engine.call("transfer", {"src": 1, "dst": 2, "amount": 30}) == {
            "id": "t0",
            "status": "committed",
            "batch": 1,
            "txn": 0,
            "restarts": 0,
            "result": 70,
            "error": None,
        }
        assert (engine.read("account", 1), engine.read("account", 2), engine.read("account", 9)) == (70, 130, 100)
        outcomes = engine.run(
            [
                {"id": "a", "proc": "transfer", "args": {"src": 1, "dst": 3, "amount": 500}},
                {"id": "a", "proc": "transfer", "args": {"src": 1, "dst": 3, "amount": 1}},
                {"id": "b", "proc": "transfer", "args": {"src": "x", "dst": 3, "amount": 1}},
                b"{not json",
                {"id": "c", "proc": "peek", "args": {"account": 4}},
            ]
        )
        assert [(o["id"], o["status"]) for o in outcomes] == [
            ("a", "aborted"),
            ("a", "rejected"),
            ("b", "rejected"),
            ("@0:4", "rejected"),
            ("c", "aborted"),
        ]
        assert outcomes[0]["error"] == "insufficient funds"
        assert outcomes[1]["error"] == "duplicate request id 'a'"
        assert "argument 'src': expected integer" in outcomes[2]["error"]
        assert outcomes[4]["error"] == (
            "undeclared access: write of account[4] is not in the write set declared by ANALYZE"
        )
        assert engine.state() == {("account", 1): 70, ("account", 2): 130}


def test_check_deterministic_agrees_for_a_deterministic_app():
    requests = [
        {"id": f"r{i}", "proc": "transfer", "args": {"src": i % 5, "dst": (i * 3) % 7, "amount": 40}}
        for i in range(120)
    ]
    outcomes = check_deterministic(bank(), requests, batch_size=25)
    assert {o["status"] for o in outcomes} == {"committed", "aborted"}


def test_check_deterministic_names_a_procedure_that_is_not():
    app = bank()
    calls = itertools.count()

    def key(args):
        return [], [("account", args["account"])]

    @app.procedure(args={"account": Int(0)}, analyze=key)
    def stamp(ctx, args):
        ctx.write("account", args["account"], next(calls))  # state outside ctx: differs run to run

    with pytest.raises(AssertionError, match="not deterministic: .* differ at"):
        check_deterministic(app, [{"id": f"s{i}", "proc": "stamp", "args": {"account": i}} for i in range(4)])


def test_the_harness_reads_composite_keys_as_lists_names_its_changes_and_takes_a_dependent_step():
    import tests.every_kind_procedures as kinds

    with TestEngine(kinds) as engine:
        engine.call("kind_name_item", {"name": "bolt", "item": 2}, "bind")
        first = engine.call("kind_restock_named", {"name": "bolt", "qty": 3}, "n1")
        step = first["result"]["args"]["@ollp"]
        assert first["status"] == "restarted" and (step["restarts"], step["assumed"]) == (0, [2]) and step["sig"]
        [decided] = engine.run([{"id": first["id"], **first["result"]}])
        assert (decided["id"], decided["status"]) == ("n1", "committed")
        assert engine.read("kind_stock", 2) == 3
        change = engine.changes[-1]
        assert (change.batch, change.txn, change.table, change.key, change.value) == (3, 0, "kind_stock", 2, 3)
        assert change == (3, 0, "kind_stock", 2, 3)

    app = ordo.App("composite")
    app.table("stock")

    @app.procedure(args={"warehouse": Int(0), "item": Int(0)})
    class put:
        def analyze(args):
            return [], [("stock", (args["warehouse"], args["item"]))]

        def run(ctx, args):
            ctx.write("stock", [args["warehouse"], args["item"]], 7)  # a list, as JSON gives keys

    with TestEngine(app) as engine:
        assert engine.call("put", {"warehouse": 2, "item": 3})["status"] == "committed"
        assert engine.read("stock", [2, 3]) == engine.read("stock", (2, 3)) == 7
