"""Seeded key samplers shared by the workload generators."""

from __future__ import annotations

import bisect
import itertools
import random


class Zipf:
    """Zipf(θ) over ranks 0..n-1 (rank 0 hottest); θ = 0 is uniform."""

    def __init__(self, n: int, theta: float):
        if n <= 0:
            raise ValueError("Zipf needs n > 0")
        self.n = n
        weights = [1.0 / (rank + 1) ** theta for rank in range(n)]
        self._cdf = list(itertools.accumulate(weights))

    def sample(self, rng: random.Random) -> int:
        return min(bisect.bisect_left(self._cdf, rng.random() * self._cdf[-1]), self.n - 1)

    def distinct(self, rng: random.Random, count: int) -> list[int]:
        if count > self.n:
            raise ValueError(f"cannot draw {count} distinct keys from {self.n}")
        seen: dict[int, None] = {}
        while len(seen) < count:
            seen.setdefault(self.sample(rng))
        return list(seen)


def request(workload: str, seed: int, index: int, proc: str, args: dict) -> dict:
    return {"id": f"{workload}-{seed}-{index}", "proc": proc, "args": args}
