"""The read exchange over sockets, as workers in processes of their own use it: values
reach a transaction waiting by future or by callback, in whichever order sends and the
wait come; a peer that sends garbage fails every waiting transaction instead of leaving
it waiting for ever."""

from __future__ import annotations

import asyncio
import struct

from scheduler.socket_exchange import SocketExchange


async def _pair() -> tuple[SocketExchange, SocketExchange]:
    a, b = SocketExchange(0), SocketExchange(1)
    addresses = {0: await a.listen("127.0.0.1"), 1: await b.listen("127.0.0.1")}
    await a.connect(addresses)
    await b.connect(addresses)
    return a, b


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.01)


def test_values_reach_callbacks_and_futures_whichever_comes_first():
    async def scenario():
        a, b = await _pair()
        got = []
        a.when_received(1, 0, 2, got.append)  # waits for two senders; both come later
        b.send(1, 0, (0,), {b"x": 1})
        b.flush()
        await _settle()
        assert got == []  # one of two
        b.send(1, 0, (0,), {b"y": 2})
        b.send(1, 5, (0,), {b"z": 3})  # before anyone waits for it
        b.flush()
        await _settle()
        assert got == [{b"x": 1, b"y": 2}]
        a.when_received(1, 5, 1, got.append)  # already there: still called from the loop
        assert len(got) == 1
        await asyncio.sleep(0)
        assert got[1] == {b"z": 3}
        b.send(2, 0, (0,), {b"w": 4})
        b.flush()
        assert await asyncio.wait_for(a.receive(2, 0, 1), 5) == {b"w": 4}
        assert not len(a.mailbox)  # nothing left behind
        a.close()
        b.close()

    asyncio.run(scenario())


def test_a_peer_sending_garbage_fails_every_waiting_transaction():
    async def scenario():
        a, b = await _pair()
        got = []
        a.when_received(1, 0, 1, got.append)
        waiting = asyncio.ensure_future(a.receive(1, 1, 1))
        b._writers[0].write(struct.pack(">I", 3) + b"bad")  # not a message
        await _settle()
        assert got == [None] and a.mailbox.failure is not None
        try:
            await asyncio.wait_for(waiting, 5)
        except RuntimeError as exc:
            assert "exchange with a peer failed" in str(exc)
        else:
            raise AssertionError("a waiting receive did not fail")
        a.when_received(1, 2, 1, got.append)  # after the failure: fails at once
        await asyncio.sleep(0)
        assert got == [None, None]
        a.close()
        b.close()

    asyncio.run(scenario())
