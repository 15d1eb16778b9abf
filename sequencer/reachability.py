"""Is a broker there at all? One metadata request with a short timeout, before a command
starts anything: an unreachable broker is one line at once, not a minute of librdkafka's
retries ending in a traceback."""

from __future__ import annotations

import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ordo.sequencer.kafka import kafka_config

TIMEOUT = 5.0


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
            if time.monotonic() < deadline - 0.5:
                time.sleep(0.5)
                continue
            error = exc.args[0] if exc.args else None
            reason = error.str() if error is not None and hasattr(error, "str") else str(exc)
            raise BrokerUnreachable(
                f"no Kafka broker answers at {bootstrap} within {limit:g} s ({reason}): is it running, and is "
                f"--bootstrap-servers right? (`ordo broker --port 9092` runs a local one)") from None
