"""The read exchange between partition workers in processes of their own: what the
participants of multi-partition transactions send each other (local reads to the
executor, writes back to the other writers), over a TCP connection per pair of workers.

A Ray actor call costs a few milliseconds between busy processes; a chain of conflicting
multi-partition transactions waits that long per link, so the exchange goes over plain
sockets, set up once through Ray (each worker listens, every worker gets the addresses).

Sends are held back until every task that can run now has had its turn, then leave as
one message per peer carrying every transaction's values.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from typing import Any

_LENGTH = struct.Struct(">I")


class SocketExchange:
    def __init__(self, partition: int):
        self.partition = partition
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._server: asyncio.AbstractServer | None = None
        self._outbox: dict[tuple[int, int], dict[int, dict]] = {}  # (peer, batch) -> {txn: values}
        # (batch, txn) -> [values, senders so far, the receiver's future or callback, or None,
        # senders it waits for]
        self._slots: dict[tuple[int, int], list] = {}
        self._flush_scheduled = False
        self.failure: BaseException | None = None
        self.on_wait = None  # see ReadExchange.receive

    # -- set-up ---------------------------------------------------------------------------

    async def listen(self, host: str) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._serve, host, 0)
        return host, self._server.sockets[0].getsockname()[1]

    async def connect(self, addresses: dict[int, tuple[str, int]]) -> None:
        for peer, (host, port) in addresses.items():
            if peer == self.partition:
                continue
            _, writer = await asyncio.open_connection(host, port)
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._writers[peer] = writer

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readexactly(_LENGTH.size)
                batch_id, payload = pickle.loads(await reader.readexactly(_LENGTH.unpack(head)[0]))
                self.deliver(batch_id, payload)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the peer closed (it stopped), or this worker is closing
        except BaseException as exc:
            self.failure = exc
            loop = asyncio.get_running_loop()
            for slot in self._slots.values():
                waiter = slot[2]
                if waiter is None:
                    continue
                if type(waiter) is asyncio.Future:
                    if not waiter.done():
                        waiter.set_exception(self._failed())
                else:
                    loop.call_soon(waiter, None)
            raise

    # -- the exchange -----------------------------------------------------------------------

    def send(self, batch_id: int, index: int, to: tuple[int, ...], values: dict[bytes, Any]) -> None:
        for peer in to:
            self._outbox.setdefault((peer, batch_id), {})[index] = values
        self.flush()

    def flush(self) -> None:
        """Send what is held once every task that can run now has had its turn: the loop
        runs this callback after the tasks already ready, before it waits for anything.
        So a scheduler may flush after every step at no cost in messages."""
        if self._outbox and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._write_out)

    def _write_out(self) -> None:
        self._flush_scheduled = False
        outbox, self._outbox = self._outbox, {}
        for (peer, batch_id), payload in outbox.items():
            data = pickle.dumps((batch_id, payload), protocol=pickle.HIGHEST_PROTOCOL)
            self._writers[peer].write(_LENGTH.pack(len(data)) + data)

    def deliver(self, batch_id: int, payload: dict[int, dict]) -> None:
        slots = self._slots
        for index, values in payload.items():
            key = (batch_id, index)
            slot = slots.get(key)
            if slot is None:  # arrived before its receiver asked: keep it (unpickled, so ours)
                slots[key] = [values, 1, None, 0]
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

    async def receive(self, batch_id: int, index: int, senders: int) -> dict[bytes, Any]:
        """The values `senders` peers sent for this transaction, merged. One future per
        transaction that has to wait, resolved by the delivery that completes it."""
        key = (batch_id, index)
        slot = self._slots.get(key)
        if slot is None or slot[1] < senders:
            if self.failure is not None:
                raise self._failed()
            if slot is None:
                slot = self._slots[key] = [{}, 0, None, 0]
            loop = asyncio.get_running_loop()
            slot[2] = loop.create_future()
            slot[3] = senders
            if self.on_wait is not None:  # after the sends already scheduled: peers wait for those
                loop.call_soon(self.on_wait)
                self.on_wait = None
            await slot[2]
        del self._slots[key]
        return slot[0]

    def when_received(self, batch_id: int, index: int, senders: int, callback) -> None:
        key = (batch_id, index)
        slot = self._slots.get(key)
        loop = asyncio.get_running_loop()
        if self.failure is not None:
            loop.call_soon(callback, None)
        elif slot is not None and slot[1] >= senders:
            del self._slots[key]
            loop.call_soon(callback, slot[0])
        else:
            if slot is None:
                slot = self._slots[key] = [{}, 0, None, 0]
            slot[2] = callback
            slot[3] = senders
            if self.on_wait is not None:
                loop.call_soon(self.on_wait)
                self.on_wait = None

    def _failed(self) -> RuntimeError:
        return RuntimeError(f"partition {self.partition}: the exchange with a peer failed: {self.failure!r}")

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        if self._server is not None:
            self._server.close()
