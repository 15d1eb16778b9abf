"""Read exchange between partition workers that share one event loop (one process)."""

from __future__ import annotations

import asyncio
from typing import Any


class LocalExchange:
    """Participants of a multi-partition transaction deposit their local reads here; an
    active participant waits until every other participant has sent."""

    def __init__(self) -> None:
        self._slots: dict[tuple[int, int, int], list] = {}

    def _slot(self, batch_id: int, index: int, partition: int) -> list:
        slot = self._slots.get((batch_id, index, partition))
        if slot is None:
            slot = self._slots[(batch_id, index, partition)] = [{}, 0, asyncio.Event()]
        return slot

    def endpoint(self, partition: int) -> "LocalEndpoint":
        return LocalEndpoint(self, partition)


class LocalEndpoint:
    def __init__(self, exchange: LocalExchange, partition: int):
        self._exchange = exchange
        self.partition = partition

    def send(self, batch_id: int, index: int, to: tuple[int, ...], values: dict[bytes, Any]) -> None:
        for peer in to:
            slot = self._exchange._slot(batch_id, index, peer)
            slot[0].update(values)
            slot[1] += 1
            slot[2].set()

    def flush(self) -> None:
        """Sends are delivered at once in one process: nothing is held back."""

    async def receive(self, batch_id: int, index: int, senders: int) -> dict[bytes, Any]:
        key = (batch_id, index, self.partition)
        slot = self._exchange._slot(batch_id, index, self.partition)
        while slot[1] < senders:
            slot[2].clear()
            await slot[2].wait()
        del self._exchange._slots[key]
        return slot[0]
