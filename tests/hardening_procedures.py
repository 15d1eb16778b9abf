"""A user procedures module (loaded with `--procedures tests.hardening_procedures`) whose
procedures hand back what no output or shard can hold, or change their own arguments.
Each has the operation form where the operation-chain scheduler would otherwise take a
path of its own."""

from ordo.procedures.args import Int, List
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.operations import READ_MODIFY, WRITE, Operations

TABLES = [Table("h", partitioner="modulo")]

BIG = "x" * (70 * 1024)
HUGE = {1: 2**64, -1: -(2**63) - 1}


def _write_key(args):
    return [], [("h", args["key"])]


def _rmw_key(args):
    return [("h", args["key"])], [("h", args["key"])]


def _rmw_keys(args):
    keys = [("h", k) for k in args["keys"]]
    return keys, keys


def _big(ctx, args):
    ctx.write("h", args["key"], 1)
    return BIG


def _big_ops(args):
    return Operations([WRITE("h", args["key"], 1)], lambda outputs: BIG)


def _nan(ctx, args):
    ctx.write("h", args["key"], 1)
    return float("nan")


def _nan_ops(args):
    return Operations([WRITE("h", args["key"], 1)], lambda outputs: float("nan"))


def _huge(ctx, args):
    if args["sign"] == 0:
        ctx.write("h", args["key"], ctx.read("h", args["key"]) + 2**64)
    else:
        ctx.write("h", args["key"], HUGE[args["sign"]])
    return None


def _huge_ops(args):
    if args["sign"] == 0:
        return Operations([READ_MODIFY("h", args["key"], lambda value: value + 2**64)])
    return Operations([WRITE("h", args["key"], HUGE[args["sign"]])])


def _take(ctx, args):
    """Empties its own key list while it works: run again on the same object, it would do
    nothing, and ANALYZE would refuse the arguments."""
    keys, total = args["keys"], 0
    while keys:
        key = keys.pop()
        value = ctx.read("h", key) + 1
        ctx.write("h", key, value)
        total += value
    return total


def _bump(ctx, args):
    args["add"] += 10
    ctx.write("h", args["key"], ctx.read("h", args["key"]) + args["add"])
    return args["add"]


def _plus_one(ctx, args):
    ctx.write("h", args["key"], ctx.read("h", args["key"]) + 1)
    return None


def _failing_ops(args):
    # The form fails where RUN does not: the operation-chain scheduler falls back to RUN
    # for the whole stretch, running again what it already ran.
    return Operations([READ_MODIFY("h", args["key"], lambda value: value // 0)])


PROCEDURES = [
    Procedure("h_big", {"key": Int(0)}, _write_key, _big, operations=_big_ops),
    Procedure("h_nan", {"key": Int(0)}, _write_key, _nan, operations=_nan_ops),
    Procedure("h_huge", {"key": Int(0), "sign": Int(-1, 1)}, _rmw_key, _huge, operations=_huge_ops),
    Procedure("h_take", {"keys": List(Int(0), min_len=1, max_len=8)}, _rmw_keys, _take),
    Procedure("h_bump", {"key": Int(0), "add": Int(0, 100)}, _rmw_key, _bump),
    Procedure("h_plus_one", {"key": Int(0)}, _rmw_key, _plus_one, operations=_failing_ops),
]
