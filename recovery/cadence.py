"""Which batches every partition checkpoints after.

Each worker decides on its own, from the log alone, so every partition checkpoints the
same batches without asking anyone:

- every K batches (`--checkpoint-every K`): batch ids that are multiples of K;
- every T seconds of log time (`--checkpoint-every Ts`, the default): a batch whose time in
  the log (the sequencer's stamp) falls in another T-second slot of the epoch than the
  batch before it.

A count of batches fits tests and tools that need a checkpoint at a known batch. Time fits
a running engine: the sequencer cuts a batch every epoch (2 ms on one partition), so a
count of batches is a checkpoint five times a second there, each a memtable flush that
holds the worker (4–23 ms measured, docs/recovery.md), while T seconds of log time bound both the cost and
what a recovery replays, whatever the epoch and the load.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

DEFAULT_CHECKPOINT_EVERY = "10s"
_SECONDS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*s\s*$")


@dataclass(frozen=True, slots=True)
class Cadence:
    batches: int = 0  # every batch id that is a multiple of it; 0: not by count
    seconds: float = 0.0  # each time the log's time enters another slot of this length; 0: not by time

    @property
    def enabled(self) -> bool:
        return self.batches > 0 or self.seconds > 0

    def due(self, batch_id: int, time_ms: int, previous_time_ms: int) -> bool:
        """Whether the batch `batch_id`, stamped `time_ms` in the log, is checkpointed;
        `previous_time_ms` is the stamp of the batch before it, as the log cursor carries it
        (log/records.py), 0 before the first batch: a new shard is not checkpointed at once."""
        if self.batches:
            return batch_id % self.batches == 0
        if not self.seconds or not previous_time_ms:
            return False
        slot_ms = self.seconds * 1000
        return time_ms // slot_ms != previous_time_ms // slot_ms


def cadence(value: int | str | Cadence) -> Cadence:
    """A Cadence from `--checkpoint-every`'s value: K batches (an integer), T seconds
    ("10s"), or 0 (never)."""
    if isinstance(value, Cadence):
        return value
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"checkpoint every {value} batches: give 0 (never) or more")
        return Cadence(batches=value)
    text = str(value)
    if text.strip().isdigit():
        return Cadence(batches=int(text))
    match = _SECONDS.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(
            f"{text!r} is no checkpoint cadence: give K batches (an integer, 0: never) or T seconds of log time, e.g. 10s"
        )
    return Cadence(seconds=float(match.group(1)))


def checkpoint_every(text: str) -> int | str:
    """An argparse type for `--checkpoint-every`: K (batches) as an integer, "Ts" as given."""
    try:
        parsed = cadence(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return parsed.batches if not parsed.seconds else text.strip()
