"""The request wire format: one JSON object per Kafka message, message key = request id
(it spreads requests over partitions; the engine reads the id from the body alone).

    {"id": "r-42", "proc": "sl_transfer", "args": {...}}

`parse_request` turns any bytes into a log entry, never an exception:
    [id, proc, args]   a request that will run
    [id, None, error]  a rejected request, with a clear reason
and every entry it returns can be encoded into the log (msgpack): no text in it holds a
lone surrogate, no integer exceeds 64 bits, no number is NaN or infinite, and nothing is
nested deeper than `MAX_DEPTH`.

A message that is not a request (its id unreadable, or not the three fields) is answered
under its position in the topic, `@partition:offset`: never under an id it claims (in its
body or its Kafka key), which may be another request's. No request id starts with '@', so
a position cannot be a request's id either: the outcomes under an id answer requests that carry it.

Ids the engine derives are kept out of a client's reach alike (`id_problem`): a request on
`<ns>.requests` whose id has the form of a source record's default id
(`topic:partition:offset`, `topic#n:partition:offset`, sequencer/sources.py) is not a
request, and no id holds a NUL, which separates a re-sequenced OLLP step's restart count
in the duplicate memory (procedures/ollp.py `request_identity`). A client therefore cannot
take the id of a source record or of an engine's step before it and have it rejected as
a duplicate.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ordo.procedures.args import MAX_DEPTH, list_fields, text_problem, value_problem
from ordo.log.steps import step_problem
from ordo.procedures.registry import Registry, RequestError

MAX_ID_LENGTH = 256

# Raw surrogate bytes fail the strict decode, so a lone surrogate can only come from a
# \uD800-\uDFFF escape: text without one needs no walk for it.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKET = re.compile(r"[][{}]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to infinity
        raise ValueError(f"number {text[:40]} out of range")
    return value


# NaN and Infinity are Python's extension of JSON, refused here at no cost to other
# numbers; floats are rare in requests, so checking each one costs nothing either.
_decode = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float).decode


def _too_deep(text: str) -> bool:
    """Whether `text` nests deeper than `MAX_DEPTH`, brackets inside strings aside."""
    depth = 0
    for bracket in _BRACKET.findall(_JSON_STRING.sub("", text)):
        if bracket in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        else:
            depth -= 1
    return False


def _safe(text: str) -> str:
    """Text that msgpack can encode, whatever produced it."""
    if text_problem(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode()


POSITION_MARK = "@"  # starts the id of an outcome named by position; no request id may
INCARNATION_MARK = "#"  # a later incarnation of a source topic in its records' ids: orders#2:0:5
STEP_SEPARATOR = "\x00"  # between an OLLP step's id and its restarts in the duplicate memory
# A source record's default id (sequencer/sources.py `record_id`): the engine's, never a client's.
_SOURCE_FORM = re.compile(r"[A-Za-z0-9._-]{1,249}(?:#[0-9]+)?:[0-9]+:[0-9]+")


def position_id(partition: int, offset: int) -> str:
    """The id that answers a message that is not a request: where it stands."""
    return f"{POSITION_MARK}{partition}:{offset}"


def source_id_problem(request_id) -> str | None:
    """Why an id cannot name a request at all, or None: what a source's own `id` mapping
    must meet (it may give any other id, the source form included: the app chose it)."""
    if type(request_id) is not str or not request_id:
        return "missing or invalid 'id' (non-empty string)"
    if len(request_id) > MAX_ID_LENGTH:
        return f"'id' longer than {MAX_ID_LENGTH} characters"
    if request_id.startswith(POSITION_MARK):
        return f"'id' must not start with '{POSITION_MARK}' (outcomes named by position use it)"
    if STEP_SEPARATOR in request_id:
        return "'id' must not hold a NUL character (the engine's OLLP steps use it)"
    return None


def id_problem(request_id) -> str | None:
    """Why a body's 'id' cannot name a client's request on `<ns>.requests`, or None: also
    none of the ids the engine derives (a source record's default id)."""
    problem = source_id_problem(request_id)
    if problem is None and _SOURCE_FORM.fullmatch(request_id) is not None:
        return (
            "'id' has the form of a source record's id (topic:partition:offset), which only the "
            "engine gives: use another id (docs/client.md, 'Request ids')"
        )
    return problem


def fields_problem(body: dict) -> str | None:
    """Why a body with a usable id is still not a request (not exactly id, proc, args)."""
    missing = [field for field in ("proc", "args") if field not in body]
    if missing:
        return f"missing field(s): {', '.join(missing)}"
    extra = sorted(set(body) - {"id", "proc", "args"})
    if extra:
        return f"unknown field(s): {', '.join(extra)}"
    return None


def parse_request(
    value: bytes | None,
    key: bytes | None,
    partition: int,
    offset: int,
    registry: Registry,
    max_bytes: int,
    ordering: str | None = None,
) -> list:
    return parse_request_sets(value, key, partition, offset, registry, max_bytes, ordering)[0]


def parse_request_sets(
    value: bytes | None,
    key: bytes | None,
    partition: int,
    offset: int,
    registry: Registry,
    max_bytes: int,
    ordering: str | None = None,
    id_check=id_problem,
) -> tuple[list, tuple | None]:
    """`parse_request`, with the read and write sets ANALYZE gave an accepted request
    (None for a rejected one), so that placing it needs no second ANALYZE. The message's
    Kafka key names nothing: only a readable body does. `id_check`: what the id must meet
    (a source record's, sequencer/sources.py, may have the form reserved to sources)."""
    if value is None:
        return [position_id(partition, offset), None, "empty message"], None
    if len(value) > max_bytes:
        return [
            position_id(partition, offset),
            None,
            f"request too large: {len(value)} bytes > limit {max_bytes}",
        ], None
    try:
        # Strict, unlike json.loads (which lets surrogates encoded as bytes through).
        text = value.decode(json.detect_encoding(value))
    except UnicodeDecodeError as exc:
        return [position_id(partition, offset), None, f"invalid JSON: not valid Unicode text: {exc}"], None
    # Bracket counts bound the depth from above; only a message with many of them is scanned.
    if text.count("[") + text.count("{") > MAX_DEPTH and _too_deep(text):
        return [position_id(partition, offset), None, f"request nested deeper than {MAX_DEPTH} levels"], None
    try:
        body = _decode(text)
    except RecursionError:  # cannot happen below MAX_DEPTH; kept so no input can stop the sequencer
        return [position_id(partition, offset), None, f"request nested deeper than {MAX_DEPTH} levels"], None
    except ValueError as exc:
        return [position_id(partition, offset), None, f"invalid JSON: {exc}"], None
    if "\\u" in text and _SURROGATE_ESCAPE.search(text) is not None:
        problem = value_problem(body)
        if problem is not None:
            return [position_id(partition, offset), None, f"invalid request: {problem}"], None
    if type(body) is not dict:
        return [position_id(partition, offset), None, "request must be a JSON object"], None
    request_id = body.get("id")
    problem = id_check(request_id) or fields_problem(body)
    if problem is not None:
        return [position_id(partition, offset), None, problem], None
    try:
        procedure, read_set, write_set = registry.analyze(body["proc"], body["args"], ordering)
    except RequestError as exc:
        return [request_id, None, _safe(str(exc))], None
    args = body["args"]
    forged = step_problem(request_id, procedure.name, args)
    if forged is not None:
        return [request_id, None, f"{procedure.name}: {forged}"], None
    if list_fields(procedure.args) is None:
        problem = value_problem(args)  # a field type of the procedure's own may let anything by
        if problem is not None:
            return [request_id, None, f"{procedure.name}: bad arguments: {problem}"], None
    return [request_id, body["proc"], args], (read_set, write_set)


def encode_request(request_id: str, proc: str, args: dict[str, Any]) -> bytes:
    return json.dumps({"id": request_id, "proc": proc, "args": args}, separators=(",", ":")).encode()
