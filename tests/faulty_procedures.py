"""A user procedures module (loaded with `--procedures tests.faulty_procedures`) whose
procedure fails at RUN time for some arguments."""

from ordo.procedures.args import Int
from ordo.procedures.contract import Procedure, Table

TABLES = [Table("ratio")]


def _keys(args):
    return [], [("ratio", args["key"])]


def _divide(ctx, args):
    ctx.write("ratio", args["key"], 100 // args["by"])
    return 100 // args["by"]


PROCEDURES = [Procedure("faulty_divide", {"key": Int(0), "by": Int()}, _keys, _divide)]
