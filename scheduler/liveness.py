"""When a worker process that does not answer is reported, and how: a partition worker
(a Ray actor) or a sequencer (a child process of `ordo run`) that is stopped, hung or
starved says nothing by itself, so the engine times every call to it and says which
process it waits for, with its pid."""

from __future__ import annotations

from dataclasses import dataclass

# A control call to a worker (status, hold, stop) is answered in milliseconds; one
# unanswered this long is reported.
SILENT_AFTER = 5.0
# How long any call to a worker may take before the engine gives up on it.
CALL_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Silence:
    name: str  # "partition 1", "sequencer", "sequencer 2"
    pid: int | None
    seconds: float

    def __str__(self) -> str:
        return (
            f"{self.name} (pid {self.pid if self.pid is not None else '?'}) has not answered for {self.seconds:.0f} s"
        )
