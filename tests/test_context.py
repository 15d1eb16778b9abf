"""`ordo.Context`, what RUN receives as `ctx`: public, documented member by member in
docs/api.md and docs/procedures.md, and the type of the context every procedure gets, plain
or part of a dataflow, run by the real partition workers (ordo.testing.TestEngine)."""

from __future__ import annotations

import os
import re

import ordo
from ordo import Int
from ordo.testing import TestEngine
from tests.helpers import ROOT

MEMBERS = ("read", "write", "delete", "scan", "abort", "now", "random", "emit", "window_insert", "window")


def _doc(name: str) -> str:
    with open(os.path.join(ROOT, "docs", name)) as f:
        return f.read()


def test_the_context_is_public_and_every_member_documented():
    assert "Context" in ordo.__all__ and "Context" in dir(ordo)
    api = _doc("api.md")
    assert "### `class ordo.Context(Protocol)`" in api
    for member in MEMBERS:
        assert re.search(rf"^#### `Context\.{member}\b", api, re.MULTILINE), member
    run_section = _doc("procedures.md").split("\n## RUN\n", 1)[1].split("\n## ", 1)[0]
    table = [line for line in run_section.splitlines() if line.startswith("| `ctx.")]
    assert sorted(re.match(r"\| `ctx\.(\w+)", line).group(1) for line in table) == sorted(MEMBERS)


app = ordo.App("contexts")
app.table("seen", default=None)
app.table("count", default=0)


@app.procedure(args={"k": Int(0)}, keys=[("seen", "k")])
def plain(ctx, args):
    ctx.write("seen", args["k"], isinstance(ctx, ordo.Context))


@app.procedure(args={"k": Int(0)}, keys=[("seen", "k")])
def emit_alone(ctx, args):
    ctx.emit("counted", [args["k"]])


@app.procedure(args={"k": Int(0)}, keys=[("seen", "k")])
def window_alone(ctx, args):
    return ctx.window("recent")


@app.procedure(args={"k": Int(0)}, keys=[("count", "k")])
def vote(ctx, args):
    ctx.write("count", args["k"], isinstance(ctx, ordo.Context))
    ctx.emit("counted", [args["k"]])


@app.procedure(args={}, analyze=lambda args: ([], [("seen", -args["k"] - 1)]))
def tally(ctx, batch):
    for (k,) in batch:
        ctx.window_insert("recent", [k])
        ctx.write("seen", -k - 1, isinstance(ctx, ordo.Context) and ctx.window("recent") == [[k]])


app.stream("counted", producers=["vote"], consumers=["tally"])
app.window("recent", owner="tally", rows=4, slide=1)


def test_plain_and_dataflow_procedures_receive_an_ordo_context():
    with TestEngine(app) as engine:
        assert engine.call("plain", {"k": 1})["status"] == "committed"
        outcome = engine.call("vote", {"k": 2})
        assert outcome["status"] == "committed", outcome
        assert outcome["steps"] == [{"proc": "tally", "status": "committed", "error": None}]
        assert engine.read("seen", 1) is True  # plain
        assert engine.read("count", 2) is True  # the dataflow's input procedure
        assert engine.read("seen", -3) is True  # its triggered procedure, with the window it owns


def test_streams_and_windows_outside_a_dataflow_abort_with_the_reason():
    with TestEngine(app) as engine:
        emitted = engine.call("emit_alone", {"k": 1})
        assert emitted["status"] == "aborted"
        assert emitted["error"].startswith("undeclared access: emit to stream 'counted': "), emitted
        assert "no part of a dataflow" in emitted["error"]
        read = engine.call("window_alone", {"k": 1})
        assert read["status"] == "aborted"
        assert read["error"].startswith("undeclared access: read of window 'recent': "), read
