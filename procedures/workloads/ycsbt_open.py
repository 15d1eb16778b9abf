"""YCSB-T's transfer without ANALYZE, in the module form (examples/ycsbt.py is the App
form): it names its home key, the account it takes from, and its keys are found by
running it (docs/procedures.md, "Without ANALYZE"). `ordo bench ycsbt --knob analyze=0`
runs it."""

from ordo.procedures.contract import Procedure
from ordo.procedures.workloads.ycsbt import ARGS, TABLES, transfer

PROCEDURES = [Procedure("ycsbt_transfer", ARGS, None, transfer, home=("ycsbt", "a"))]
__all__ = ["TABLES", "PROCEDURES"]
