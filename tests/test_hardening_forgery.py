"""Only the sequencer's batches count, and only the engine makes OLLP steps: a client that
can write to `<ns>.log` or `<ns>.requests` can neither inject a batch, nor stop the
namespace, nor make a step or take a later request's id. Records are forged with a plain
Kafka client, from what an attacker can read on the log."""

from __future__ import annotations

import json
import subprocess
import time

import msgpack
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from ordo.log.records import encode_batch, encode_entry
from ordo.broker.topics import ensure_topics
from tests.helpers import dump_state, ordo, read_results, stop
from tests.test_hardening_log import cli, deposits, ended, submit

pytestmark = pytest.mark.slow


def expected_state(ids: range | list[int]) -> dict:
    """What the deposits of `deposits()` leave, computed from the requests alone."""
    state: dict = {}
    for i in ids:
        state[("account", i % 7)] = state.get(("account", i % 7), 0) + 1
        state[("asset", i % 3)] = state.get(("asset", i % 3), 0) + 2
    return state


def deposit_state(data: str) -> dict:
    return {k: v for k, v in dump_state(data).items() if k[0] in ("account", "asset")}


def newest_batch(bootstrap: str, log_topic: str) -> list:
    """The newest batch on the log as an attacker sees it: msgpack, read with a plain consumer."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "attacker",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(log_topic, 0, 0)])
    newest = None
    try:
        while True:
            message = consumer.poll(5)
            if message is None or (message.error() and message.error().code() == -191):  # end of the partition
                break
            unpacker = msgpack.Unpacker(strict_map_key=False)
            unpacker.feed(message.value())
            record = next(unpacker)
            if record[0] == 1:
                newest = record
    finally:
        consumer.close()
    assert newest is not None, "no batch on the log"
    return newest


def forged_batch(newest: list, epoch: int, request_id: str) -> bytes:
    """A well-formed batch of the newest batch's sequencer, generation and log, at `epoch`,
    holding one deposit of 1000 to account 0."""
    _, _, generation, time_ms, offsets, _, log_id, sequencer = newest[:8]
    entry = encode_entry(
        [request_id, "sl_deposit", {"account": 0, "asset": 0, "account_amount": 1000, "asset_amount": 1000}]
    )
    ends = {int(p): [span[1], span[1]] for p, span in offsets.items()}
    return msgpack.packb([1, epoch, generation, time_ms + 1, ends, None, log_id, sequencer, entry])


def append(bootstrap: str, topic: str, value: bytes) -> int:
    """Append one record with a plain producer; its offset."""
    producer = Producer({"bootstrap.servers": bootstrap})
    delivered = []
    producer.produce(topic, value, partition=0, on_delivery=lambda error, message: delivered.append(message))
    producer.flush(10)
    return delivered[0].offset()


def start_engine(broker: str, namespace: str, data: str, partitions: int = 1) -> subprocess.Popen:
    return ordo(
        "run",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        data,
        "--quiet",
        "--partitions",
        str(partitions),
        "--runtime",
        "local" if partitions == 1 else "ray",
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("ahead, partitions", [(1, 1), (5, 1), (1, 2)])
def test_a_forged_batch_changes_nothing_and_is_reported(broker, namespace, tmp_path, ahead, partitions):
    ensure_topics(broker, namespace)
    data = str(tmp_path / "d")
    engine = start_engine(broker, namespace, data, partitions)
    try:
        submit(broker, namespace, deposits(0, 20))
        read_results(broker, f"{namespace}.results", 20, timeout=90)
        newest = newest_batch(broker, f"{namespace}.log")
        forged_at = append(broker, f"{namespace}.log", forged_batch(newest, newest[1] + ahead, "forged-1"))
        for round_ in range(6):  # the sequencer's own next batches, the one at the forged epoch among them
            submit(broker, namespace, deposits(100 + 10 * round_, 10))
            time.sleep(0.3)
        results = read_results(broker, f"{namespace}.results", 80, timeout=90)
        assert engine.poll() is None, "the engine stopped"
    finally:
        assert stop(engine) == 0
        lines = engine.stderr.read()
    ids = {r["id"] for r in results}
    assert ids == {f"d{i}" for i in [*range(20), *range(100, 160)]}, "requests lost or a forged one ran"
    assert deposit_state(data) == expected_state([*range(20), *range(100, 160)])
    assert f"passed over the record at offset {forged_at} of {namespace}.log: not signed" in lines, lines


def test_a_record_that_stops_the_log_is_passed_over_after_ordo_log_skip(broker, namespace, tmp_path):
    ensure_topics(broker, namespace)
    data = str(tmp_path / "d")
    log = f"{namespace}.log"
    engine = start_engine(broker, namespace, data)
    try:
        submit(broker, namespace, deposits(0, 20))
        read_results(broker, f"{namespace}.results", 20, timeout=90)
        # A genuine gap: a batch signed with the log secret (as a sequencer would sign it),
        # five epochs ahead of its lane.
        _, epoch, generation, time_ms, _, _, log_id, sequencer = newest_batch(broker, log)[:8]
        gap = encode_batch(
            epoch + 5,
            generation,
            time_ms + 1,
            {},
            [
                encode_entry(
                    ["gap-1", "sl_deposit", {"account": 0, "asset": 0, "account_amount": 1000, "asset_amount": 1000}]
                )
            ],
            log_id=log_id,
            sequencer=sequencer,
            namespace=namespace,
        )
        gap_at = append(broker, log, gap)
        submit(broker, namespace, deposits(100, 10))
        code = ended(engine, 90)
        lines = engine.stderr.read() if code is not None else ""
    finally:
        stop(engine)
    assert code not in (None, 0), "the engine went past a gap"
    stops = [line for line in lines.splitlines() if "log gap" in line]
    assert len(stops) == 1 and f"ordo log skip --offset {gap_at}" in stops[0], lines
    assert "Traceback" not in lines, lines

    refused = cli("log", "skip", "--bootstrap-servers", broker, "--namespace", namespace, "--offset", "0")
    assert refused.returncode == 2 and "does not stop the log's readers" in refused.stderr, refused.stderr
    done = cli("log", "skip", "--bootstrap-servers", broker, "--namespace", namespace, "--offset", str(gap_at))
    assert done.returncode == 0, done.stderr
    assert f"the record at offset {gap_at} stopped the log's readers" in done.stderr, done.stderr

    again = start_engine(broker, namespace, data)
    try:
        submit(broker, namespace, deposits(200, 10))
        results = read_results(broker, f"{namespace}.results", 40, timeout=120)
    finally:
        assert stop(again) == 0
        lines = again.stderr.read()
    real = [*range(20), *range(100, 110), *range(200, 210)]
    assert {r["id"] for r in results} == {f"d{i}" for i in real}
    assert deposit_state(data) == expected_state(real)
    assert f"passed over the record at offset {gap_at} of {log}: a skip record" in lines, lines

    # A rebuild from the log passes over the same record.
    rebuilt = str(tmp_path / "rebuilt")
    recovered = cli(
        "recover",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--data-dir",
        rebuilt,
        "--runtime",
        "local",
        "--quiet",
        "--idle",
        "2",
        timeout=240,
    )
    assert recovered.returncode == 0, recovered.stderr
    assert deposit_state(rebuilt) == expected_state(real)


def submit_wait(broker: str, namespace: str, request: dict, timeout: float = 30) -> subprocess.CompletedProcess:
    return cli(
        "submit",
        "--bootstrap-servers",
        broker,
        "--namespace",
        namespace,
        "--file",
        "-",
        "--wait",
        "--timeout",
        str(timeout),
        input=json.dumps(request) + "\n",
        timeout=timeout + 60,
    )


def outcomes_of(done: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def bind(alias: str, account: int) -> dict:
    return {"id": f"bind-{alias}", "proc": "alias_bind", "args": {"alias": alias, "account": account}}


def test_a_client_reconnaissance_resent_gets_the_duplicate_outcome(broker, namespace, tmp_path):
    ensure_topics(broker, namespace)
    engine = start_engine(broker, namespace, str(tmp_path / "d"))
    try:
        assert submit_wait(broker, namespace, bind("bob", 7)).returncode == 0
        request = {
            "id": "recon-1",
            "proc": "alias_deposit",
            "args": {"alias": "bob", "amount": 5, "@ollp": {"restarts": 0, "assumed": [7]}},
        }
        first = submit_wait(broker, namespace, request)
        assert first.returncode == 0 and [o["status"] for o in outcomes_of(first)] == ["committed"], first.stderr
        again = submit_wait(broker, namespace, request)
        assert again.returncode == 1 and again.stderr.strip().endswith("1 rejected"), (
            f"the resend got no outcome: {again.stderr}"
        )
        [outcome] = outcomes_of(again)
        assert outcome["status"] == "rejected" and "duplicate request id 'recon-1'" in outcome["error"]
    finally:
        assert stop(engine) == 0
    assert dump_state(str(tmp_path / "d"))[("alias_account", 7)] == 5


def test_a_client_step_cannot_take_a_later_requests_id(broker, namespace, tmp_path):
    ensure_topics(broker, namespace)
    data = str(tmp_path / "d")
    engine = start_engine(broker, namespace, data)
    try:
        for alias, account in (("bob", 7), ("mallory", 8)):
            assert submit_wait(broker, namespace, bind(alias, account)).returncode == 0
        attack = {
            "id": "victim-d",
            "proc": "alias_deposit",
            "args": {"alias": "mallory", "amount": 1, "@ollp": {"restarts": 0, "assumed": [8]}},
        }
        assert submit_wait(broker, namespace, attack).returncode == 0
        victim = submit_wait(
            broker, namespace, {"id": "victim-d", "proc": "alias_deposit", "args": {"alias": "bob", "amount": 100}}
        )
        # The id was taken first: the victim is told so, instead of its deposit vanishing
        # behind an outcome that is not its own.
        assert victim.returncode == 1 and victim.stderr.strip().endswith("1 rejected"), (
            f"the victim's request got no outcome: {victim.stderr}"
        )
        [outcome] = outcomes_of(victim)
        assert outcome["status"] == "rejected" and "duplicate request id 'victim-d'" in outcome["error"]
        # A step signed by anyone but the engine is refused outright.
        forged = {
            "id": "victim-e",
            "proc": "alias_deposit",
            "args": {"alias": "mallory", "amount": 1, "@ollp": {"restarts": 0, "assumed": [8], "sig": "00"}},
        }
        [refused] = outcomes_of(submit_wait(broker, namespace, forged))
        assert refused["status"] == "rejected" and "not the engine's signature" in refused["error"]
        honest = submit_wait(
            broker, namespace, {"id": "victim-f", "proc": "alias_deposit", "args": {"alias": "bob", "amount": 100}}
        )
        assert [o["status"] for o in outcomes_of(honest)] == ["committed"]
    finally:
        assert stop(engine) == 0
    state = dump_state(data)
    assert state[("alias_account", 7)] == 100 and state[("alias_account", 8)] == 1
