"""The request wire format: one JSON object per Kafka message, message key = request id.

    {"id": "r-42", "proc": "sl_transfer", "args": {...}}

`parse_request` turns any message into a log entry, never an exception:
    [id, proc, args]   a request that will run
    [id, None, error]  a rejected request, with a clear reason
"""

from __future__ import annotations

import json
from typing import Any

from procedures.registry import Registry, RequestError

MAX_ID_LENGTH = 256


def fallback_id(key: bytes | None, partition: int, offset: int) -> str:
    """The id of a message whose body has no usable id: its Kafka key, else its position."""
    if key:
        return key.decode("utf-8", errors="replace")[:MAX_ID_LENGTH]
    return f"@{partition}:{offset}"


def parse_request(value: bytes | None, key: bytes | None, partition: int, offset: int,
                  registry: Registry, max_bytes: int) -> list:
    return parse_request_sets(value, key, partition, offset, registry, max_bytes)[0]


def parse_request_sets(value: bytes | None, key: bytes | None, partition: int, offset: int,
                       registry: Registry, max_bytes: int) -> tuple[list, tuple | None]:
    """`parse_request`, with the read and write sets ANALYZE gave an accepted request
    (None for a rejected one), so that placing it needs no second ANALYZE."""
    if value is None:
        return [fallback_id(key, partition, offset), None, "empty message"], None
    if len(value) > max_bytes:
        return [fallback_id(key, partition, offset), None,
                f"request too large: {len(value)} bytes > limit {max_bytes}"], None
    try:
        body = json.loads(value)
    except (UnicodeDecodeError, ValueError) as exc:
        return [fallback_id(key, partition, offset), None, f"invalid JSON: {exc}"], None
    if type(body) is not dict:
        return [fallback_id(key, partition, offset), None, "request must be a JSON object"], None
    request_id = body.get("id")
    if type(request_id) is not str or not request_id:
        return [fallback_id(key, partition, offset), None, "missing or invalid 'id' (non-empty string)"], None
    if len(request_id) > MAX_ID_LENGTH:
        return [fallback_id(key, partition, offset), None, f"'id' longer than {MAX_ID_LENGTH} characters"], None
    missing = [field for field in ("proc", "args") if field not in body]
    if missing:
        return [request_id, None, f"missing field(s): {', '.join(missing)}"], None
    extra = sorted(set(body) - {"id", "proc", "args"})
    if extra:
        return [request_id, None, f"unknown field(s): {', '.join(extra)}"], None
    try:
        _, read_set, write_set = registry.analyze(body["proc"], body["args"])
    except RequestError as exc:
        return [request_id, None, str(exc)], None
    return [request_id, body["proc"], body["args"]], (read_set, write_set)


def encode_request(request_id: str, proc: str, args: dict[str, Any]) -> bytes:
    return json.dumps({"id": request_id, "proc": proc, "args": args}, separators=(",", ":")).encode()
