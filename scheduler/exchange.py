"""The receiving side of the read exchange, and the exchange between partition workers
that share one event loop (one process)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable


class Mailbox:
    """What peers sent one partition's multi-partition transactions, by (batch, txn),
    merged as it arrives. A transaction waits for it with `when_received`: the deposit that
    completes it has the event loop call the callback. The first wait of a batch schedules
    `on_wait` (if set, once), after everything the current step schedules, its sends
    included: the worker prepares its next batch then, and no peer waits for that."""

    def __init__(self) -> None:
        # (batch, txn) -> [values, senders so far, the receiver's callback or None,
        # senders it waits for]
        self._slots: dict[tuple[int, int], list] = {}
        self.on_wait: Callable[[], None] | None = None
        self.failure: BaseException | None = None

    def deposit(self, key: tuple[int, int], values: dict[bytes, Any], owned: bool) -> None:
        """`values` from one sender; `owned`: the mailbox may keep the dict itself."""
        slots = self._slots
        slot = slots.get(key)
        if slot is None:  # before its receiver asked
            slots[key] = [values if owned else dict(values), 1, None, 0]
            return
        slot[0].update(values)
        slot[1] += 1
        callback = slot[2]
        if callback is not None and slot[1] >= slot[3]:
            del slots[key]
            asyncio.get_running_loop().call_soon(callback, slot[0])

    def when_received(
        self, key: tuple[int, int], senders: int, callback: Callable[[dict[bytes, Any] | None], None]
    ) -> None:
        """Calls `callback` from the event loop, never from inside this call: with the
        values, or with None once the exchange has failed."""
        slot = self._slots.get(key)
        loop = asyncio.get_running_loop()
        if self.failure is not None:
            loop.call_soon(callback, None)
            return
        if slot is not None and slot[1] >= senders:
            del self._slots[key]
            loop.call_soon(callback, slot[0])
            return
        if slot is None:
            slot = self._slots[key] = [{}, 0, None, 0]
        slot[2] = callback
        slot[3] = senders
        if self.on_wait is not None:
            # Two hops: after every send the current step schedules, not only those
            # scheduled so far (a batch's first wait may come before its first send).
            loop.call_soon(loop.call_soon, self.on_wait)
            self.on_wait = None

    def fail(self, failure: BaseException) -> None:
        """Nothing more will arrive: every waiting transaction, and every later one, is
        called back with None."""
        self.failure = failure
        loop = asyncio.get_running_loop()
        for slot in self._slots.values():
            if slot[2] is not None:
                loop.call_soon(slot[2], None)

    def __len__(self) -> int:
        return len(self._slots)


class LocalExchange:
    """Participants of a multi-partition transaction deposit their local reads in each
    other's mailboxes; an active participant waits until every other participant has sent."""

    def __init__(self) -> None:
        self._mailboxes: dict[int, Mailbox] = {}

    def mailbox(self, partition: int) -> Mailbox:
        mailbox = self._mailboxes.get(partition)
        if mailbox is None:
            mailbox = self._mailboxes[partition] = Mailbox()
        return mailbox

    def endpoint(self, partition: int) -> "LocalEndpoint":
        return LocalEndpoint(self, partition)


class LocalEndpoint:
    def __init__(self, exchange: LocalExchange, partition: int):
        self._exchange = exchange
        self.partition = partition
        self.mailbox = exchange.mailbox(partition)

    def send(self, batch_id: int, index: int, to: tuple[int, ...], values: dict[bytes, Any]) -> None:
        mailbox = self._exchange.mailbox
        for peer in to:  # a copy each: the sender's dict stays the sender's
            mailbox(peer).deposit((batch_id, index), values, owned=False)

    def flush(self) -> None:
        """Sends are delivered at once in one process: nothing is held back."""

    def when_received(self, batch_id: int, index: int, senders: int, callback) -> None:
        self.mailbox.when_received((batch_id, index), senders, callback)
