"""A procedures module that `ordo run` imports but the sequencer process it starts cannot,
as a module needing something only the engine's environment has would: its sequencer
fails at every start."""

import os

from ordo.services import PARENT_ENV
from ordo.procedures.args import Int
from ordo.procedures.contract import Procedure, Table

if os.environ.get(PARENT_ENV):  # set only in a child that `ordo run` started
    raise ImportError("tests.sequencer_only_failing_procedures cannot be imported in the sequencer process")

TABLES = [Table("sf")]


def _put(ctx, args):
    ctx.write("sf", args["key"], 1)


PROCEDURES = [Procedure("sf_put", {"key": Int(0)}, lambda args: ([], [("sf", args["key"])]), _put)]
