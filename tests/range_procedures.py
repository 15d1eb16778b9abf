"""Procedures over declared ranges, for the range tests: lines appended under a group's
prefix (a write range), totals scanned over it (a read range), and point updates of
single lines (which lock the range they lie in), within one group or across two."""

from ordo.procedures.args import Int
from ordo.procedures.contract import Prefix, Procedure, Table

TABLES = [
    Table("rline", partition_by=0, range_by=2, default=None),
    Table("rhead", partition_by=0),
    Table("rtotal", partition_by=0),
]
GROUP = {"g": Int(0, 9), "s": Int(0, 9)}


def _append_keys(args):
    head = ("rhead", (args["g"], args["s"]))
    return [head], [head, Prefix("rline", (args["g"], args["s"]))]


def _append(ctx, args):
    g, s = args["g"], args["s"]
    n = ctx.read("rhead", (g, s))
    ctx.write("rline", [g, s, n], args["v"])  # a list, as a key from msgpack would be
    ctx.write("rhead", (g, s), n + 1)
    return n


def _total_keys(args):
    return [Prefix("rline", (args["g"], args["s"]))], [("rtotal", (args["g"], args["s"]))]


def _total(ctx, args):
    rows = ctx.scan("rline", (args["g"], args["s"]))
    assert all(type(key) is tuple for key, _ in rows)
    total = sum(value for _, value in rows)
    if rows:
        first = ctx.read("rline", rows[0][0])  # a point read under the declared range
        assert first == rows[0][1]
    ctx.write("rtotal", (args["g"], args["s"]), total)
    return [total, len(rows)]


def _bump_keys(args):
    keys = [("rline", (args["g"], args["s"], args["n"])), ("rline", (args["g2"], args["s"], args["n"]))]
    return keys, keys


def _bump(ctx, args):
    """Move d from one line to another (of possibly another group): a multi-partition one."""
    a, b = (args["g"], args["s"], args["n"]), (args["g2"], args["s"], args["n"])
    va, vb = ctx.read("rline", a), ctx.read("rline", b)
    if va is None or vb is None:
        ctx.abort("no such line")
    ctx.write("rline", a, va - args["d"])
    ctx.write("rline", b, ctx.read("rline", b) + args["d"])  # the same line when g == g2


def _sneak_keys(args):
    return [Prefix("rline", (args["g"], args["s"]))], []


def _sneak(ctx, args):
    ctx.write("rline", (args["g"], args["s"], 0), 1)  # a read range does not allow writes


PROCEDURES = [
    Procedure("r_append", {**GROUP, "v": Int(0, 100)}, _append_keys, _append),
    Procedure("r_total", GROUP, _total_keys, _total),
    Procedure("r_bump", {**GROUP, "g2": Int(0, 9), "n": Int(0, 20), "d": Int(0, 5)}, _bump_keys, _bump),
    Procedure("r_sneak", GROUP, _sneak_keys, _sneak),
    Procedure(
        "r_wide",
        GROUP,
        lambda a: ([Prefix("rline", (a["g"], a["s"])), ("rhead", (a["g"] + 1, 0))], []),
        lambda ctx, a: None,
    ),
    Procedure("r_short", GROUP, lambda a: ([Prefix("rline", (a["g"],))], []), lambda ctx, a: None),
]
