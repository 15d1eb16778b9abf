"""The log: the total order of requests, one Kafka partition of msgpack records.

Two record kinds:
    start:  [START, token]
        written by a sequencer when it takes over; the n-th start record in the log opens
        generation n.
    batch:  [BATCH, batch_id, generation, time_ms, offsets, entry, entry, ...]
        an epoch of requests; `offsets` maps request partition -> [start, end) consumed;
        each entry is [id, proc, args] or [id, None, error] (rejected).

Every reader applies the same acceptance rule (`LogCursor.accept`), so the log means one
thing to the sequencer, the engine and a replay, whatever the broker does: a batch is
accepted only if it carries the current generation and the next batch id. Records of a
fenced or aborted sequencer transaction, should a broker deliver them, are therefore
either consistently accepted by every reader or consistently ignored.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack

START = 0
BATCH = 1
_ARRAY32 = struct.Struct(">BI")


class LogError(RuntimeError):
    """The log cannot be followed: a batch is missing or a record is unreadable."""


def encode_start(token: str) -> bytes:
    return msgpack.packb([START, token])


def encode_entry(entry: list) -> bytes:
    return msgpack.packb(entry)


def encode_batch(batch_id: int, generation: int, time_ms: int,
                 offsets: dict[int, tuple[int, int]], encoded_entries: list[bytes]) -> bytes:
    """Entries are encoded one by one as they arrive (so an epoch's size is known exactly
    before it is cut) and concatenated here under one array header."""
    head = [BATCH, batch_id, generation, time_ms, {p: list(r) for p, r in offsets.items()}]
    return (
        _ARRAY32.pack(0xDD, len(head) + len(encoded_entries))
        + b"".join(msgpack.packb(item) for item in head)
        + b"".join(encoded_entries)
    )


BATCH_OVERHEAD = 256  # bytes of a batch record beyond its entries, with room to spare


@dataclass(slots=True)
class Batch:
    batch_id: int
    generation: int
    time_ms: int
    offsets: dict[int, list[int]]
    entries: list[list]
    log_offset: int = -1


def decode(value: bytes) -> tuple[int, Any]:
    try:
        record = msgpack.unpackb(value, strict_map_key=False, use_list=True)
        kind = record[0]
        if kind == START:
            return START, record[1]
        if kind == BATCH:
            return BATCH, Batch(record[1], record[2], record[3], record[4], record[5:])
    except Exception as exc:
        raise LogError(f"unreadable log record: {exc}") from exc
    raise LogError(f"unknown log record kind {kind!r}")


@dataclass(slots=True)
class LogCursor:
    """How far a reader has followed the log. Persisted with applied state, so a restart
    continues exactly where the last applied batch left off."""

    next_batch: int = 1
    generation: int = 0
    next_offset: int = 0  # next Kafka offset of the log partition to read
    request_offsets: dict[int, int] = field(default_factory=dict)  # partition -> next offset

    def accept(self, value: bytes, offset: int) -> Batch | None:
        """Advance past the record at `offset`; return it if it is the next batch."""
        self.next_offset = offset + 1
        kind, record = decode(value)
        if kind == START:
            self.generation += 1
            return None
        batch: Batch = record
        if batch.generation != self.generation or batch.batch_id < self.next_batch:
            return None  # a fenced sequencer's record, or a repeat
        if batch.batch_id > self.next_batch:
            raise LogError(
                f"log gap: expected batch {self.next_batch}, found batch {batch.batch_id} at offset {offset}"
            )
        self.next_batch += 1
        for partition, (_, end) in batch.offsets.items():
            self.request_offsets[int(partition)] = end
        batch.log_offset = offset
        return batch

    def to_dict(self) -> dict[str, Any]:
        return {
            "next_batch": self.next_batch,
            "generation": self.generation,
            "next_offset": self.next_offset,
            "request_offsets": dict(self.request_offsets),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LogCursor":
        return cls(
            data["next_batch"],
            data["generation"],
            data["next_offset"],
            {int(p): o for p, o in data["request_offsets"].items()},
        )
