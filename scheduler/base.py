"""The scheduler interface. A scheduler sees a batch's transactions in log order with
their read and write sets, and decides when each may run; the result must equal running
them one by one in log order."""

from __future__ import annotations

from abc import ABC, abstractmethod
from operator import attrgetter, itemgetter

from ordo.scheduler.batch import BatchExecution, PreparedTxn


class Scheduler(ABC):
    name: str

    @abstractmethod
    async def run_batch(self, txns: list[PreparedTxn], execution: BatchExecution) -> None:
        """Run every transaction of `txns` (this partition's share of one batch, in log
        order) through `execution`."""


SCHEDULERS: dict[str, type[Scheduler]] = {}


def register(cls: type[Scheduler]) -> type[Scheduler]:
    SCHEDULERS[cls.name] = cls
    return cls


def make_scheduler(name: str) -> Scheduler:
    # Each module registers itself on import.
    import ordo.scheduler.aria  # noqa: F401
    import ordo.scheduler.locking  # noqa: F401
    import ordo.scheduler.opchain  # noqa: F401
    import ordo.scheduler.serial  # noqa: F401
    import ordo.scheduler.vll  # noqa: F401

    try:
        return SCHEDULERS[name]()
    except KeyError:
        raise ValueError(f"unknown scheduler '{name}' (choose from {', '.join(sorted(SCHEDULERS))})") from None


_by_index = attrgetter("index")
_by_txn = itemgetter(0)


def in_log_order(execution: BatchExecution) -> None:
    """Concurrent schedulers finish transactions out of order; put outcomes and change
    data back in log order so a partition's outputs are the same bytes on every run.
    The sort is stable, so each transaction's changes keep their encoded-key order."""
    execution.outcomes.sort(key=_by_index)
    execution.changes.sort(key=_by_txn)
    execution.streamed.sort(key=_by_txn)


def available_schedulers() -> list[str]:
    """Names of every scheduler, for the CLI and the tests."""
    make_scheduler("serial")  # imports (and so registers) all of them
    return sorted(SCHEDULERS)
