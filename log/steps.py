"""A step of a dependent transaction (procedures/ollp.py) on its way back through
`<ns>.requests`: the engine signs it with the log secret, and the sequencer takes a request
carrying an OLLP record with a signature only when the signature is the engine's, so no
client can pass its own assumptions off as a step the engine decided."""

from __future__ import annotations

import json
from typing import Any

from ordo.log.secret import tag, verify
from ordo.procedures.ollp import OLLP_FIELD, SIGNATURE

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def restart_request(request_id: str, result: dict) -> bytes:
    """The message a re-sequenced transaction's executor appends to <ns>.requests: signed."""
    proc, args = result["proc"], result["args"]
    record = {**args[OLLP_FIELD], SIGNATURE: step_signature(request_id, proc, args)}
    return _dumps({"id": request_id, "proc": proc, "args": {**args, OLLP_FIELD: record}}).encode()


def step_signature(request_id: str, proc: str, args: dict) -> str:
    """The signature of a step: its id, procedure and arguments ("sig" aside) under the log
    secret, over their canonical JSON, which a step's trip through JSON keeps."""
    return tag(b"ollp-step", _step_body(request_id, proc, args)).hex()


def _step_body(request_id: str, proc: str, args: dict) -> bytes:
    record = {k: v for k, v in args[OLLP_FIELD].items() if k != SIGNATURE}
    body = json.dumps(
        [request_id, proc, {**args, OLLP_FIELD: record}],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return body.encode("utf-8", "surrogatepass")


def step_problem(request_id: str, proc: str, args: Any) -> str | None:
    """Why a request's OLLP record cannot be taken as the engine's step, or None: a "sig"
    that is not the engine's. (Without "sig" it is a client's own reconnaissance.)"""
    record = args.get(OLLP_FIELD) if type(args) is dict else None
    if type(record) is not dict or SIGNATURE not in record:
        return None
    signature = record[SIGNATURE]
    if type(signature) is not str or not _signed(signature, _step_body(request_id, proc, args)):
        return (
            f"'{OLLP_FIELD}.{SIGNATURE}' is not the engine's signature of this step: only the engine "
            f"re-sequences a step; a client may send '{OLLP_FIELD}' without '{SIGNATURE}' (its own "
            f"reconnaissance, a request like any other)"
        )
    return None


def _signed(signature: str, body: bytes) -> bool:
    """Whether `signature` is a step's tag under a key the engine accepts (while the log
    secret is rotated, the earlier one too)."""
    try:
        expected = bytes.fromhex(signature)
    except ValueError:
        return False
    return verify(b"ollp-step", body, expected)
