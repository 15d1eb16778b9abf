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

from ordo.scheduler.exchange import Mailbox

_LENGTH = struct.Struct(">I")


class SocketExchange:
    def __init__(self, partition: int):
        self.partition = partition
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._server: asyncio.AbstractServer | None = None
        self._outbox: dict[tuple[int, int], dict[int, dict]] = {}  # (peer, batch) -> {txn: values}
        self.mailbox = Mailbox()  # what peers sent this partition's transactions
        self._flush_scheduled = False

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
            self.mailbox.fail(exc)
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
        deposit = self.mailbox.deposit
        for index, values in payload.items():  # unpickled: the mailbox may keep them
            deposit((batch_id, index), values, owned=True)

    def when_received(self, batch_id: int, index: int, senders: int, callback) -> None:
        self.mailbox.when_received((batch_id, index), senders, callback)

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        if self._server is not None:
            self._server.close()
