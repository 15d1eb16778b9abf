"""The read exchange over sockets, as workers in processes of their own use it: values
reach a waiting transaction's callback in whichever order sends and the wait come; a peer
that sends garbage fails every waiting transaction instead of leaving it waiting for ever."""

from __future__ import annotations

import asyncio
import struct

from ordo.scheduler.socket_exchange import SocketExchange


async def _pair() -> tuple[SocketExchange, SocketExchange]:
    a, b = SocketExchange(0), SocketExchange(1)
    addresses = {0: await a.listen("127.0.0.1"), 1: await b.listen("127.0.0.1")}
    await a.connect(addresses)
    await b.connect(addresses)
    return a, b


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.01)


def test_values_reach_callbacks_whichever_comes_first():
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
        assert not len(a.mailbox)  # nothing left behind
        a.close()
        b.close()

    asyncio.run(scenario())


def test_the_first_wait_of_a_batch_lets_every_send_of_the_step_leave_first():
    """A worker prepares its next batch at its first wait (`on_wait`). A batch's first
    wait may come before its first send in the same step; the sends still leave first,
    so no peer waits for that preparation."""

    async def scenario():
        a, b = await _pair()
        order = []
        written = a._write_out

        def write_out():
            order.append("sent")
            written()

        a._write_out = write_out
        a.mailbox.on_wait = lambda: order.append("prepared ahead")
        a.when_received(1, 0, 1, lambda values: None)  # the first wait, then a send
        a.send(1, 1, (1,), {b"x": 1})
        await _settle()
        assert order == ["sent", "prepared ahead"]
        a.close()
        b.close()

    asyncio.run(scenario())


def test_a_peer_sending_garbage_fails_every_waiting_transaction():
    async def scenario():
        a, b = await _pair()
        got = []
        a.when_received(1, 0, 1, got.append)
        a.when_received(1, 1, 2, got.append)
        b._writers[0].write(struct.pack(">I", 3) + b"bad")  # not a message
        await _settle()
        assert got == [None, None] and a.mailbox.failure is not None
        a.when_received(1, 2, 1, got.append)  # after the failure: fails at once
        await asyncio.sleep(0)
        assert got == [None, None, None]
        a.close()
        b.close()

    asyncio.run(scenario())


def test_a_failed_exchange_fails_the_transaction_waiting_on_it():
    """What a scheduler sees: the batch's multi-partition transaction raises, naming the
    exchange, instead of waiting for ever."""
    from ordo.scheduler.batch import BatchExecution, prepare
    from ordo.log.records import Batch
    from ordo.storage.overlay import BatchOverlay
    from ordo.storage.partitioning import Partitioner
    from ordo.procedures.registry import default_registry

    registry = default_registry()
    partitioner = Partitioner.for_tables(2, {t.name: t.partitioner for t in registry.tables.values()})
    batch = Batch(1, 1, 1_000, {}, [["r0", "micro_rmw", {"keys": [0, 1]}]])
    (txn,), _ = prepare(batch, registry, partitioner, 0)

    class Empty:
        def get_many(self, keys):
            return [None] * len(keys)

    async def scenario():
        a, b = await _pair()
        execution = BatchExecution(
            batch,
            txn.executor,
            BatchOverlay(Empty()),
            {"micro": 0},
            lambda t, k, e: partitioner.of(t, k, e),
            a if txn.executor == 0 else b,
        )
        peer = b if txn.executor == 0 else a
        running = asyncio.ensure_future(execution.run(txn))
        await _settle()
        assert not running.done()  # waiting for the peer's reads
        peer._writers[txn.executor].write(struct.pack(">I", 3) + b"bad")
        try:
            await asyncio.wait_for(running, 5)
        except RuntimeError as exc:
            assert "read exchange with a peer failed" in str(exc)
        else:
            raise AssertionError("the transaction did not fail")
        a.close()
        b.close()

    asyncio.run(scenario())
