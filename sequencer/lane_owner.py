"""Who sequences a namespace's request partitions now: one engine per namespace.

A sequencer notes who it is (which `ordo run` or `ordo sequence`, pid, host) and when, in
the metadata of the request positions it commits to its group `<ns>.sequencer`: at most
every 0.25 s while it appends batches (sequencer.NOTE_EVERY), and every two seconds while
idle (sequencer.WATCH_EVERY). A sequencer starting on partitions whose note still moves is
refused before it writes its start record, naming the live one: a second `ordo run` on a
namespace (another data directory, by mistake) would otherwise take the first one's lane
over, and have it taken back in turn at its restart.

A note that does not move within STILL_FOR is a process gone (a crash, a kill): the start
goes on, so a sequencer restarted after a crash waits at most that long, and one restarted
by its own engine (the same owner) not at all. Notes are compared with each other, never
with this machine's clock beyond the first look (a note older than FRESH_FOR is not watched).
Two starts that both pass the look at once still never take turns: the one whose lane the
other's start record took over stops once it reads that record (sequencer/takeover.py,
`Superseded`) and is not restarted.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

from confluent_kafka import Consumer, KafkaException, TopicPartition

from ordo.broker.clients import kafka_config

# Set by `ordo run` for the sequencers it starts: who they sequence for, so that a
# sequencer it restarts takes its own engine's note for its own.
OWNER_ENV = "ORDO_SEQUENCER_OWNER"
# `ordo sequence`'s exit status when another engine's sequencer has its partitions (refused at
# start, or superseded later): an engine that started it stops instead of restarting it.
EXIT_ANOTHER_ENGINE = 3
# A note newer than this is watched to see whether it moves.
FRESH_FOR = 10.0
# How long a live sequencer's note surely moves in: three of its idle beats.
STILL_FOR = 6.5


class LaneTaken(RuntimeError):
    """Another live sequencer takes these request partitions."""


class Superseded(RuntimeError):
    """Another sequencer's start record took this one's lane over."""


_process_owner: dict | None = None


def own_owner(what: str) -> dict:
    """This process's identity for its notes: the engine's that started it, or its own (one
    per process: a sequencer it starts again in-process is the same owner)."""
    global _process_owner
    inherited = os.environ.get(OWNER_ENV)
    if inherited:
        try:
            owner = json.loads(inherited)
            if isinstance(owner, dict) and isinstance(owner.get("id"), str) and isinstance(owner.get("who"), str):
                return owner
        except ValueError:
            pass
    if _process_owner is None:
        _process_owner = {"id": uuid.uuid4().hex, "who": f"{what} (pid {os.getpid()} on {socket.gethostname()})"}
    return _process_owner


def owner_env(who: str) -> str:
    """OWNER_ENV's value for the sequencers an engine starts."""
    return json.dumps({"id": uuid.uuid4().hex, "who": who})


def note(owner: dict, stopped: bool = False) -> str:
    """The metadata a sequencer commits with its request positions; `stopped` for its last,
    when it stops of its own accord, so that a start right after it need not watch."""
    return json.dumps(
        {
            "id": owner["id"],
            "who": owner["who"],
            "at": int(time.time() * 1000),
            **({"stopped": True} if stopped else {}),
        },
        separators=(",", ":"),
    )


def _read_notes(consumer: Consumer, topic: str, partitions: list[int], timeout: float) -> dict[int, dict]:
    """The notes on `partitions`; none where the broker cannot say within `timeout` (a group
    coordinator still loading): then the log alone keeps the two from taking turns (the
    superseded one stops once it reads the newer start record, sequencer/takeover.py)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            committed = consumer.committed(
                [TopicPartition(topic, p) for p in partitions], timeout=max(deadline - time.monotonic(), 0.5)
            )
            break
        except KafkaException:
            if time.monotonic() > deadline:
                return {}
            time.sleep(0.2)
    notes = {}
    for position in committed:
        try:
            found = json.loads(position.metadata or "")
        except ValueError:
            continue  # no note: positions committed by something else
        if isinstance(found, dict) and {"id", "who", "at"} <= found.keys():
            notes[position.partition] = found
    return notes


def refuse_if_taken(
    bootstrap: str, namespace: str, group: str, topic: str, partitions: list[int], owner: dict, timeout: float = 10.0
) -> None:
    """Raise LaneTaken if another owner's note on any of `partitions` moves."""
    if not partitions:
        return
    consumer = Consumer(kafka_config(bootstrap, {"group.id": group, "enable.auto.commit": False}))
    try:
        first = _read_notes(consumer, topic, partitions, timeout)
        now = time.time() * 1000
        watched = {
            p: n
            for p, n in first.items()
            if n["id"] != owner["id"] and not n.get("stopped") and now - n["at"] < FRESH_FOR * 1000
        }
        deadline = time.monotonic() + STILL_FOR
        while watched and time.monotonic() < deadline:
            time.sleep(0.5)
            for partition, latest in _read_notes(consumer, topic, list(watched), timeout).items():
                if latest["id"] != owner["id"] and latest["at"] != watched[partition]["at"]:
                    raise LaneTaken(
                        f"{latest['who']} is sequencing namespace {namespace} ({topic} partition {partition}, "
                        f"last seen {max(0.0, time.time() - latest['at'] / 1000):.0f} s ago): one engine per "
                        f"namespace; stop that one first, or use another --namespace"
                    )
        if watched:  # gone: its partitions are this owner's now, for the sequencers it starts too
            _claim(consumer, topic, list(watched), owner, timeout)
    finally:
        consumer.close()


def _claim(consumer: Consumer, topic: str, partitions: list[int], owner: dict, timeout: float) -> None:
    """Note `owner` on `partitions` at the positions committed there, which stay as they are."""
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout)
        noted = note(owner)
        consumer.commit(
            offsets=[
                TopicPartition(topic, position.partition, position.offset, metadata=noted)
                for position in committed
                if position.offset >= 0
            ],
            asynchronous=False,
        )
    except KafkaException:
        pass  # then the sequencer looks again, and waits once more for the same stale note


def who_took_over(
    bootstrap: str, group: str, topic: str, partitions: list[int], owner: dict, wait: float = 5.0
) -> str | None:
    """The newest other owner noted on `partitions`, in words, for a superseded sequencer's
    last line; None if none noted itself within `wait` seconds (a sequencer that took over
    notes itself once it has read the log up to its start record)."""
    consumer = Consumer(kafka_config(bootstrap, {"group.id": group, "enable.auto.commit": False}))
    deadline = time.monotonic() + wait
    try:
        while True:
            try:
                notes = _read_notes(consumer, topic, partitions, 5.0).values()
            except Exception:  # naming it is a courtesy: the stop goes on without it
                return "another sequencer"
            others = [n for n in notes if (n["id"], n["who"]) != (owner["id"], owner["who"]) and not n.get("stopped")]
            if others:
                return max(others, key=lambda n: n["at"])["who"]
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.25)
    finally:
        consumer.close()
