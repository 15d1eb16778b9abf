"""YCSB-T's transfer without ANALYZE: it declares only its home key, the account it takes
from, and runs under `ordo run --scheduler aria --app examples.ycsbt:app`, which finds the
keys RUN touches by running it. procedures/workloads/ycsbt.py is the same procedure with
ANALYZE (docs/procedures.md compares the two)."""

import ordo
from ordo.procedures.workloads.ycsbt import ARGS, START, transfer

app = ordo.App("ycsbt")
app.table("ycsbt", default=START, partitioner="modulo")
app.procedure("ycsbt_transfer", args=ARGS, home=("ycsbt", "a"))(transfer)
