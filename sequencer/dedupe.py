"""Memory of recent request ids: the ids of the last `capacity` requests accepted into the
log. It is a function of the log alone, so a restarted sequencer that rebuilds it from
the log rejects exactly the duplicates an uninterrupted one would have."""

from __future__ import annotations

from collections import deque

from ordo.procedures.ollp import request_identity


# How many of its newest additions a memory can take back (`rollback`): a sequencer that
# hands its lane on takes back the requests of its last, unaccepted, batches.
ROLLBACK_LIMIT = 65_536


class RecentIds:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._order: deque[str] = deque()
        self._ids: set[str] = set()
        self._added = 0
        self._evicted: deque[str] = deque(maxlen=ROLLBACK_LIMIT)  # newest last

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, request_id: str) -> None:
        self._order.append(request_id)
        self._ids.add(request_id)
        self._added += 1
        if len(self._order) > self.capacity:
            evicted = self._order.popleft()
            self._ids.discard(evicted)
            self._evicted.append(evicted)

    def mark(self) -> tuple[int, int]:
        """Where the memory stands now (ids added so far, ids held), to `rollback` to."""
        return self._added, len(self._order)

    def rollback(self, mark: tuple[int, int]) -> bool:
        """Forget what was added since `mark`, and remember again what those additions
        pushed out: the memory as it was then. False (and nothing changed) when that is
        more than it can take back."""
        added, held = self._added - mark[0], mark[1]
        still_held = min(added, len(self._order))  # the newest ids: popped first
        evicted_since = added - still_held  # of the ids added since; the newest evictions
        pushed_out = held - (len(self._order) - still_held)  # ids of then, to hold again
        if added < 0 or evicted_since + pushed_out > len(self._evicted):
            return False
        for _ in range(still_held):
            self._ids.discard(self._order.pop())
        for _ in range(evicted_since):
            self._evicted.pop()
        for _ in range(pushed_out):
            restored = self._evicted.pop()
            self._order.appendleft(restored)
            self._ids.add(restored)
        self._added = mark[0]
        return True

    def add_batch_entries(self, entries: list[list]) -> None:
        for request_id, proc, args in entries:
            if proc is not None:
                self.add(request_identity(request_id, args))
