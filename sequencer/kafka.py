"""Settings every Ordo Kafka client shares."""

from __future__ import annotations

from typing import Any


def kafka_config(bootstrap: str, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """librdkafka settings: the bootstrap servers, quiet about connections a broker closes
    at shutdown (normal, not an error), plus the caller's settings."""
    return {"bootstrap.servers": bootstrap, "log.connection.close": False, **(settings or {})}
