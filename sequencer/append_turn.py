"""Sequencers that share a log on the local broker take turns to append.

The local broker (tansu 0.6) mishandles two producers ending transactions on one partition
at the same moment: it can keep a committed transaction's end marker on its books as still
open, and then holds every later transaction of the *other* producers on that partition
short of the last stable offset, so read_committed readers stop there; if the first
producer never writes again (stopped, restarted, crashed), they stop for good
(docs/local-broker.md, "Transactions ending together"). Apache Kafka has no such fault.

So on the local broker each sequencer holds a machine-wide lock on the log while the broker
ends one of its transactions (a commit, an abort, and the fencing at start-up, which may
abort its predecessor's): no two transactions on the log ever end together. Producing the
records and the consumed offsets stays outside the turn, so sequencers wait on each other
only for the broker's end of a transaction (about half a millisecond). The local broker
listens on 127.0.0.1 only, so every sequencer of its log runs on this machine. An
uncontended turn costs two system calls per batch. The lock files are empty and stay:
removing one while another sequencer waits on it would let two hold the turn at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import time

# The cluster id tansu reports unless told otherwise; Ordo's launcher leaves it so.
LOCAL_BROKER_CLUSTER_ID = "tansu_cluster"


def needs_turns(cluster_id: str | None) -> bool:
    """Whether a broker reporting this cluster id needs its log appends taken in turns."""
    return cluster_id == LOCAL_BROKER_CLUSTER_ID


def turn_path(cluster_id: str, brokers: list[str], topic: str) -> str:
    """The lock file of one log on one broker: named by what every client of the broker
    sees alike (its cluster id and advertised addresses), not by the address this
    process happened to dial."""
    key = "|".join([cluster_id, *sorted(brokers), topic]).encode()
    return os.path.join(tempfile.gettempdir(), "ordo-append-turns", hashlib.sha256(key).hexdigest()[:24] + ".lock")


class AppendTurn:
    """`with turn:` waits, up to `wait_limit` seconds, until no other sequencer of the log
    holds the turn, and holds it for the block. The operating system releases the turn of
    a process that dies, so a crashed sequencer never blocks the others."""

    def __init__(self, path: str, topic: str, wait_limit: float):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path, self.topic, self.wait_limit = path, topic, wait_limit
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)

    def __enter__(self) -> "AppendTurn":
        if self._fd is None:
            raise RuntimeError("append turn used after close()")
        started = time.monotonic()
        pause = 0.0002
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                waited = time.monotonic() - started
                if waited > self.wait_limit:
                    raise TimeoutError(
                        f"another sequencer of {self.topic} has held its append turn on the local broker for "
                        f"over {waited:.0f} s ({self.path}): it is hung; stop that sequencer process and this "
                        f"one goes on (docs/local-broker.md, 'Transactions ending together')"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.005)

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
