"""How long the sequencer's epochs are: fixed, or following the rate requests arrive at.

Every batch costs each process something beyond its entries: the sequencer's append, every
worker's fetch of the record, their outputs and, on several partitions, a round of
exchanges between the workers. Under load, epochs must be long enough for those costs to
stay small beside the entries' own work (Calvin's 10 ms). At light load the same costs may
be affordable many times a second, while a request's wait for the end of its epoch, half
an epoch on average, is the largest part of its latency. Epochs that follow the rate
(`--min-delay-ms`) are short at light load and grow in proportion to the rate, to their
longest from a full rate on (sequencer.py, FOLLOW_FULL_AT). A batch holds at least one
request, so at most min(rate, 1 / epoch) batches are cut a second: with the longest epoch
L reached at rate F, at most √(F / L), wherever the rate is. What those extra batches cost
every process decides whether the shorter wait pays (docs/benchmarks.md, 'Epochs that
follow the rate'). Epoch lengths decide only which requests share a batch, never what a
batch does: the log records the batches as they were cut.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# How quickly the rate estimate follows a change in the load: a step in the rate is two
# thirds followed within this many seconds.
RATE_TIME_CONSTANT_S = 0.2


@dataclass(slots=True)
class EpochLength:
    """The epoch length in seconds (`now`), as the requests taken so far set it: `shortest`
    at a rate of `full_rate` × shortest / longest requests a second and below, `longest`
    from `full_rate` on, in proportion between. `full_rate` 0: always `longest`."""

    shortest: float
    longest: float
    full_rate: float = 0.0
    rate: float = field(default=0.0)  # requests a second, estimated
    _last: float | None = None  # when requests were last counted

    @property
    def fixed(self) -> bool:
        return self.full_rate <= 0 or self.shortest >= self.longest

    def taken(self, count: int, now: float) -> None:
        """`count` requests arrived since the last call (a batch's entries, at its cut)."""
        if self.fixed:
            return
        if self._last is None:
            self._last = now
            return
        elapsed = max(now - self._last, 1e-4)
        weight = 1.0 - math.exp(-elapsed / RATE_TIME_CONSTANT_S)
        self.rate += weight * (count / elapsed - self.rate)
        self._last = now

    def seconds(self) -> float:
        if self.fixed:
            return self.longest
        return min(self.longest, max(self.shortest, self.longest * self.rate / self.full_rate))
