"""YCSB-T's transfer without ANALYZE: it declares only its home key, the account it takes
from. `ordo run --scheduler aria --app examples.ycsbt:app` finds the keys RUN touches by
running it within each batch; any other scheduler by a first turn of its own in the log.
procedures/workloads/ycsbt.py is the same procedure with ANALYZE (docs/procedures.md
compares the two)."""

import ordo
from ordo.procedures.workloads.ycsbt import ARGS, START, transfer

app = ordo.App("ycsbt")
app.table("ycsbt", default=START, partitioner="modulo")
app.procedure("ycsbt_transfer", args=ARGS, home=("ycsbt", "a"))(transfer)
