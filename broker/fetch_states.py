"""What a consumer's fetcher is doing, from librdkafka's statistics (`statistics.interval.ms`):
each partition it was asked to read with its fetch state (`active` when it fetches; after a
broker restart it passes through `offset-query`, `offset-wait` or `validate-epoch-wait`),
its leader, the leader's epoch and its offsets, and the state of each broker connection.

A consumer that fetches nothing more although records wait shows it here first: a partition
that stays out of `active` for REFETCH_AFTER is read on by a new consumer, and every line
that says a reader renewed its consumer names these states, so a stall that outlives the
remedy leaves a trace of where the fetcher stood (docs/architecture.md, "Fetch stalls")."""

from __future__ import annotations

import json
import threading
import time

STATISTICS_EVERY_MS = 5000
ACTIVE = "active"


class FetchStates:
    """The latest statistics of one consumer. `settings()` go into its configuration; the
    statistics arrive with its own polls (librdkafka serves callbacks there)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partitions: dict[tuple[str, int], dict] = {}
        self._brokers: dict[str, str] = {}
        self._inactive_since: dict[tuple[str, int], float] = {}
        self.seen_at: float | None = None  # when the latest statistics came

    def settings(self) -> dict:
        return {"statistics.interval.ms": STATISTICS_EVERY_MS, "stats_cb": self.took}

    def took(self, text: str) -> None:
        try:
            stats = json.loads(text)
        except ValueError:
            return
        now = time.monotonic()
        partitions = {
            (topic, int(number)): state
            for topic, about in (stats.get("topics") or {}).items()
            for number, state in (about.get("partitions") or {}).items()
            if int(number) >= 0 and state.get("desired")
        }
        brokers = {
            about.get("nodename", name): about.get("state", "?")
            for name, about in (stats.get("brokers") or {}).items()
            if about.get("nodeid", -1) >= 0
        }
        with self._lock:
            self._partitions, self._brokers, self.seen_at = partitions, brokers, now
            for where, state in partitions.items():
                if state.get("fetch_state") == ACTIVE:
                    self._inactive_since.pop(where, None)
                else:
                    self._inactive_since.setdefault(where, now)
            for where in set(self._inactive_since) - set(partitions):
                del self._inactive_since[where]

    def inactive(self, now: float, after: float) -> list[tuple[str, int]]:
        """The partitions whose fetcher has not been `active` in any statistics for `after`
        seconds while every broker connection is up: not a broker away, a fetcher stuck."""
        with self._lock:
            if not self._brokers or any(state != "UP" for state in self._brokers.values()):
                return []
            return sorted(where for where, since in self._inactive_since.items() if now - since >= after)

    def describe(self) -> str:
        """One line: each partition's fetch state, leader, epoch and offsets; each broker's state."""
        with self._lock:
            if self.seen_at is None:
                return "no statistics yet"
            parts = [
                f"{topic}[{number}] {state.get('fetch_state')} leader {state.get('leader')} epoch "
                f"{state.get('leader_epoch')} next {state.get('next_offset')} app {state.get('app_offset')} "
                f"end {state.get('hi_offset')} stable {state.get('ls_offset')}"
                for (topic, number), state in sorted(self._partitions.items())
            ]
            brokers = ", ".join(f"{name} {state}" for name, state in sorted(self._brokers.items()))
            age = time.monotonic() - self.seen_at
        return f"{'; '.join(parts) or 'no partition'}; brokers: {brokers or 'none'} ({age:.0f} s ago)"
