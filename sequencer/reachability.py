"""Is a broker there at all? One metadata request with a short timeout, before a command
starts anything: an unreachable broker is one line at once, not a minute of librdkafka's
retries ending in a traceback."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from sequencer.kafka import kafka_config

TIMEOUT = 5.0


class BrokerUnreachable(RuntimeError):
    """No broker answered at the bootstrap servers."""


def check_reachable(bootstrap: str, timeout: float = TIMEOUT) -> None:
    admin = AdminClient(kafka_config(bootstrap, {"socket.connection.setup.timeout.ms": int(timeout * 1000)}))
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        reason = error.str() if error is not None and hasattr(error, "str") else str(exc)
        raise BrokerUnreachable(
            f"no Kafka broker answers at {bootstrap} within {timeout:g} s ({reason}): is it running, and is "
            f"--bootstrap-servers right? (`ordo broker --port 9092` runs a local one)") from None
