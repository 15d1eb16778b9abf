"""Read exchange between partition workers that share one event loop (one process)."""

from __future__ import annotations

import asyncio
from typing import Any


class LocalExchange:
    """Participants of a multi-partition transaction deposit their local reads here; an
    active participant waits until every other participant has sent."""

    def __init__(self) -> None:
        # (batch, txn, receiver) -> [values, senders so far, the receiver's future or callback,
        # or None, senders it waits for]
        self._slots: dict[tuple[int, int, int], list] = {}

    def endpoint(self, partition: int) -> "LocalEndpoint":
        return LocalEndpoint(self, partition)


class LocalEndpoint:
    def __init__(self, exchange: LocalExchange, partition: int):
        self._exchange = exchange
        self.partition = partition
        self.on_wait = None  # see ReadExchange.receive

    def send(self, batch_id: int, index: int, to: tuple[int, ...], values: dict[bytes, Any]) -> None:
        slots = self._exchange._slots
        for peer in to:
            key = (batch_id, index, peer)
            slot = slots.get(key)
            if slot is None:  # a copy: the sender's dict stays the sender's
                slots[key] = [dict(values), 1, None, 0]
                continue
            slot[0].update(values)
            slot[1] += 1
            waiter = slot[2]
            if waiter is not None and slot[1] >= slot[3]:
                if type(waiter) is asyncio.Future:
                    if not waiter.done():
                        waiter.set_result(None)
                else:  # a callback (when_received): the slot is done with
                    del slots[key]
                    asyncio.get_running_loop().call_soon(waiter, slot[0])

    def flush(self) -> None:
        """Sends are delivered at once in one process: nothing is held back."""

    failure = None  # one process: nothing between the partitions can fail

    def when_received(self, batch_id: int, index: int, senders: int, callback) -> None:
        slots = self._exchange._slots
        key = (batch_id, index, self.partition)
        slot = slots.get(key)
        loop = asyncio.get_running_loop()
        if slot is not None and slot[1] >= senders:
            del slots[key]
            loop.call_soon(callback, slot[0])
            return
        if slot is None:
            slot = slots[key] = [{}, 0, None, 0]
        slot[2] = callback
        slot[3] = senders
        if self.on_wait is not None:
            loop.call_soon(self.on_wait)
            self.on_wait = None

    async def receive(self, batch_id: int, index: int, senders: int) -> dict[bytes, Any]:
        slots = self._exchange._slots
        key = (batch_id, index, self.partition)
        slot = slots.get(key)
        if slot is None or slot[1] < senders:
            if slot is None:
                slot = slots[key] = [{}, 0, None, 0]
            loop = asyncio.get_running_loop()
            slot[2] = loop.create_future()
            slot[3] = senders
            if self.on_wait is not None:
                loop.call_soon(self.on_wait)
                self.on_wait = None
            await slot[2]
        del slots[key]
        return slot[0]
