"""Memory of recent request ids: the ids of the last `capacity` requests accepted into the
log. It is a function of the log alone, so a restarted sequencer that rebuilds it from
the log rejects exactly the duplicates an uninterrupted one would have."""

from __future__ import annotations

from collections import deque

from ordo.procedures.ollp import request_identity


class RecentIds:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._order: deque[str] = deque()
        self._ids: set[str] = set()

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, request_id: str) -> None:
        self._order.append(request_id)
        self._ids.add(request_id)
        if len(self._order) > self.capacity:
            self._ids.discard(self._order.popleft())

    def add_batch_entries(self, entries: list[list]) -> None:
        for request_id, proc, args in entries:
            if proc is not None:
                self.add(request_identity(request_id, args))
