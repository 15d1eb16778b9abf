"""The engine's outputs, as they appear on Kafka.

<ns>.results, key = request id, one record per request:
    {"id": "r-42", "status": "committed", "batch": 17, "result": null, "error": null}
<ns>.changes, key = "<batch>:<partition>", one record per batch and partition:
    {"batch": 17, "partition": 0, "changes": [
        {"txn": 3, "table": "account", "key": 9, "value": 120},      # put
        {"txn": 5, "table": "account", "key": 4, "value": null, "deleted": true}]}

Both are pure functions of the log, so a replay re-emits them byte for byte: a consumer
that keeps the last record per key sees duplicates only, never different data.
"""

from __future__ import annotations

import json
from typing import Any

from scheduler.batch import Outcome

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def outcome_record(outcome: Outcome, batch_id: int) -> bytes:
    return _dumps({
        "id": outcome.id,
        "status": outcome.status,
        "batch": batch_id,
        "result": outcome.result,
        "error": outcome.error,
    }).encode()


def change_key(batch_id: int, partition: int) -> bytes:
    return f"{batch_id}:{partition}".encode()


def change_record(batch_id: int, partition: int, changes: list[list]) -> bytes:
    return _dumps({
        "batch": batch_id,
        "partition": partition,
        "changes": [_change(index, table, key, value) for index, table, key, value in changes],
    }).encode()


def _change(index: int, table: str, key: Any, value: Any) -> dict:
    if value is None:
        return {"txn": index, "table": table, "key": key, "value": None, "deleted": True}
    return {"txn": index, "table": table, "key": key, "value": value}
