"""A user procedures module (`--procedures tests.edge_procedures`) at the edges of what a
transaction may do: write a value too large for one change-data message, declare no
keys at all."""

from ordo.procedures.args import Int, Str
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.operations import WRITE, Operations

TABLES = [Table("edge", partitioner="modulo")]


def _write_key(args):
    return [], [("edge", args["key"])]


def _big(ctx, args):
    ctx.write("edge", args["key"], "x" * args["size"])
    return args["size"]


def _big_ops(args):
    return Operations([WRITE("edge", args["key"], "x" * args["size"])], lambda outputs: args["size"])


def _no_keys(args):
    return [], []


def _echo(ctx, args):
    if args["text"] == "abort":
        ctx.abort("asked to abort")
    return args["text"].upper()


PROCEDURES = [
    Procedure("edge_big_write", {"key": Int(0), "size": Int(0, 50_000_000)}, _write_key, _big, operations=_big_ops),
    Procedure("edge_echo", {"text": Str()}, _no_keys, _echo),
]
