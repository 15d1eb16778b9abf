"""H-Store's serial scheduler: one transaction at a time, in log order. A multi-partition
transaction holds the whole partition while it waits for remote reads."""

from __future__ import annotations

from ordo.scheduler.base import Scheduler, register
from ordo.scheduler.batch import BatchExecution, PreparedTxn


@register
class SerialScheduler(Scheduler):
    name = "serial"

    async def run_batch(self, txns: list[PreparedTxn], execution: BatchExecution) -> None:
        run_single = execution.run_single
        for txn in txns:
            if txn.single:
                run_single(txn)
            else:
                await execution.run(txn)
