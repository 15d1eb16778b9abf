"""Is a broker there at all? One metadata request with a short timeout, before a command
starts anything: an unreachable broker is one line at once, not a minute of librdkafka's
retries ending in a traceback. And, for a command that serves for a long time, the same
question asked every few seconds (`BrokerWatch`): a broker that goes away is waited for."""

from __future__ import annotations

import sys
import threading
import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from ordo import stopping
from ordo.broker.clients import kafka_config

TIMEOUT = 5.0
# Errors that mean no broker answered, rather than that one answered something unexpected.
UNANSWERED = (
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError._MSG_TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
)


class BrokerUnreachable(RuntimeError):
    """No broker answered at the bootstrap servers."""


def check_reachable(bootstrap: str, timeout: float = TIMEOUT, wait: float = 0.0) -> None:
    """Raises BrokerUnreachable unless a broker answers within `timeout` seconds, or within
    `wait` seconds when that is longer (a broker started just before, still starting)."""
    limit = max(timeout, wait)
    admin = AdminClient(kafka_config(bootstrap, {"socket.connection.setup.timeout.ms": int(timeout * 1000)}))
    deadline = time.monotonic() + limit
    while True:
        try:
            admin.list_topics(timeout=min(timeout, max(0.5, deadline - time.monotonic())))
            return
        except KafkaException as exc:
            stopping.check()  # a stop while waiting for a broker that is still starting
            if time.monotonic() < deadline - 0.5:
                time.sleep(0.5)
                continue
            error = exc.args[0] if exc.args else None
            reason = error.str() if error is not None and hasattr(error, "str") else str(exc)
            raise BrokerUnreachable(
                f"no Kafka broker answers at {bootstrap} within {limit:g} s ({reason}): is it running, and is "
                f"--bootstrap-servers right? (`ordo broker --port 9092` runs a local one)"
            ) from None


# How often a long-running command looks whether the broker answers, and how often it says
# again that the broker is still away.
WATCH_EVERY = 2.0
AWAY_REMINDER_EVERY = 60.0
# Looks in a row without an answer before the broker is said to be away: one slow answer
# (a busy machine) is not an outage.
MISSES_FOR_AWAY = 2


class BrokerWatch:
    """Whether the broker answers, looked at every WATCH_EVERY seconds from a thread of its
    own, for `ordo run` and `ordo execute`: a broker that goes away is weather, not a
    failure. One line when it stops answering, one a minute while it is away, one when it
    answers again; the sequencer's supervisor asks it whether an exit was the broker's."""

    def __init__(
        self, bootstrap: str, stream=None, every: float = WATCH_EVERY, remind_every: float = AWAY_REMINDER_EVERY
    ):
        self.bootstrap = bootstrap
        self._stream = stream if stream is not None else sys.stderr
        self._every, self._remind_every = every, remind_every
        self._admin = AdminClient(
            kafka_config(
                bootstrap,
                {
                    "socket.connection.setup.timeout.ms": int(TIMEOUT * 1000),
                    # After a long outage librdkafka waits up to 10 s between reconnections: a
                    # look every WATCH_EVERY seconds would say the broker is back that much late.
                    "reconnect.backoff.max.ms": int(WATCH_EVERY * 1000),
                },
            )
        )
        self._lock = threading.Lock()
        self._back = threading.Event()
        self._back.set()
        self._stopping = threading.Event()
        self._away_since: float | None = None
        self._last_away = float("-inf")  # when the broker last did not answer a look
        self._misses = 0
        self._first_miss = 0.0  # when the looks without an answer began
        self._reminded = 0.0
        self._thread = threading.Thread(target=self._run, name="broker-watch", daemon=True)

    def start(self) -> BrokerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._back.set()

    def _run(self) -> None:
        while not self._stopping.wait(self._every):
            self.look()

    def _answers(self) -> bool:
        try:
            self._admin.list_topics(timeout=TIMEOUT)
            return True
        except KafkaException:
            return False

    def look(self) -> bool:
        """Asks the broker now; says what changed. True if it answered."""
        answers = self._answers()
        now = time.monotonic()
        with self._lock:
            self._misses = 0 if answers else self._misses + 1
            if self._misses == 1:
                self._first_miss = now
            if answers and self._away_since is not None:
                print(
                    f"the broker at {self.bootstrap} answers again after {now - self._away_since:.0f} s; carrying on",
                    file=self._stream,
                    flush=True,
                )
                self._away_since = None
                self._back.set()
            elif not answers:
                self._last_away = now
                if self._away_since is None and self._misses >= MISSES_FOR_AWAY:
                    self._away_since = self._reminded = self._first_miss
                    self._back.clear()
                    print(
                        f"the broker at {self.bootstrap} does not answer; waiting for it (requests wait in the "
                        f"clients, nothing is lost)",
                        file=self._stream,
                        flush=True,
                    )
                elif self._away_since is not None and now - self._reminded >= self._remind_every:
                    self._reminded = now
                    print(
                        f"the broker at {self.bootstrap} has not answered for {now - self._away_since:.0f} s; "
                        f"still waiting",
                        file=self._stream,
                        flush=True,
                    )
        return answers

    def away_since(self, moment: float) -> bool:
        """Whether the broker was away at some time after `moment`, or is now."""
        with self._lock:
            if self._last_away >= moment:
                return True
        return not self.look()

    def wait_until_back(self, stopping) -> None:
        """Until the broker answers again (or `stopping`, an Event, is set)."""
        while not self._back.wait(1.0) and not stopping.is_set():
            pass
