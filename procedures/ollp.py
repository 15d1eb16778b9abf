"""Dependent transactions (Calvin's OLLP): a procedure whose read and write sets depend on
stored values (an alias binding, a secondary index) declares a reconnaissance.

    Procedure(..., reconnoiter=keys_of, analyze=sets_of)
    keys_of(args) -> the keys whose values decide the sets
    sets_of(args, assumed) -> (read set, write set), `assumed` mapping each of those keys
                              to the value it is assumed to hold

The assumed values travel with the request, in its arguments under OLLP_FIELD:

    {"restarts": n, "assumed": [value of each reconnaissance key, in declared order],
     "at": log time of the turn that read them, "late": restarts after a long wait}

A request without them (what a client sends) is sequenced with the reconnaissance keys as
its read set; at its turn in the log it reads them and is re-sequenced with what it read.
A request with them is sequenced with the sets those values give (plus the
reconnaissance keys); at its turn it re-reads the keys and runs only if every value is
still the assumed one. Otherwise it is re-sequenced with the values read at its turn and
`restarts` + 1; past MAX_RESTARTS it is rejected. A restart after a wait of more than
LATE_MS of log time for its turn (the engine was working off a backlog, after a crash say)
does not count toward that limit, up to MAX_LATE_RESTARTS of them: such a transaction lost
its race to the backlog, not to contention. Every step is a function of the log (the
times are its batches' times), so every scheduler and partition count decides the same
(docs/ollp.md).

A step the engine re-sequences is signed: its record also holds "sig", an HMAC under the
namespace's log secret (log/secret.py) of its id, procedure and arguments. Only a
signed step continues a request already in the log (its duplicate check remembers id and
restart count). A record without "sig" is a client's own reconnaissance: a request like any
other, whose id is its own and checked for duplicates as such; a "sig" that does not check
is rejected. So no client can make a step, nor take the id of a request that comes later.

A procedure without ANALYZE goes through the same steps in a batch in log order, its
reconnaissance being RUN itself (docs/ollp.md, "Procedures without ANALYZE"): its record
holds the keys its runs so far touched instead of assumed values,

    {"restarts": n, "reads": [[table, key], ...], "writes": [[table, key], ...], "at": …, "late": …}

and a step runs on exactly those sets; a run that reaches another key is re-sequenced
with it added, under the same bound on restarts.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from ordo.storage.keys import decode_key, encode_key, normal_key
from ordo.storage.overlay import ABSENT
from ordo.storage.values import encode_value

OLLP_FIELD = "@ollp"
SIGNATURE = "sig"  # in the OLLP record of a step the engine re-sequenced
MAX_RESTARTS = 5
# A restart whose turn came more than LATE_MS of log time after the turn that read its
# assumptions waited behind a backlog (a normal round trip takes tens of milliseconds).
LATE_MS = 1000
MAX_LATE_RESTARTS = 20  # late restarts not counted toward MAX_RESTARTS: the backlog is finite
RESTARTED = "restarted"  # the status of a transaction re-sequenced at its turn (never published)
RECONNOITRED = "reconnoitred"  # a RESTARTED after a first pass (reconnaissance, first turn): not a restart


def first_pass(result: dict) -> bool:
    """Whether a RESTARTED outcome's next step is the one after a first pass (a dependent
    transaction's reconnaissance, a procedure without ANALYZE finding its keys), not a restart."""
    return result["args"][OLLP_FIELD]["restarts"] == 0


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


class AssumptionError(ValueError):
    """Malformed assumed values in a request."""


def split_args(args: Any) -> tuple[Any, dict | None]:
    """(the procedure's own arguments, the OLLP record or None)."""
    if type(args) is not dict or OLLP_FIELD not in args:
        return args, None
    plain = {name: value for name, value in args.items() if name != OLLP_FIELD}
    return plain, args[OLLP_FIELD]


def restarts_of(args: Any) -> int:
    if type(args) is dict:
        record = args.get(OLLP_FIELD)
        if type(record) is dict and type(record.get("restarts")) is int:
            return record["restarts"]
    return 0


def request_identity(request_id: str, args: Any) -> str:
    """What the sequencer's duplicate check remembers of a request: its id, and for a step
    the engine re-sequenced (signed; only such steps enter the log, see `step_problem`)
    also its restart count, so each step of one request enters the log once and a
    re-publication of a step (a replay) is recognised as a repeat."""
    if type(args) is dict:
        record = args.get(OLLP_FIELD)
        if type(record) is dict and SIGNATURE in record:
            return f"{request_id}\x00{record.get('restarts')}"
    return request_id


def is_resequenced(request_id: str, identity: str) -> bool:
    return identity is not request_id


def reconnaissance_keys(procedure, args: dict) -> tuple:
    keys = tuple(dict.fromkeys((table, normal_key(key)) for table, key in procedure.reconnoiter(args)))
    for table, key in keys:
        encode_key(table, key)  # a key storage cannot hold fails ANALYZE, not the turn
    return keys


def _checked_step(record: Any, own: tuple[str, ...]) -> None:
    """The fields every step's record has (restarts, perhaps at and late) and `own`, checked."""
    required = {"restarts", *own}
    fields = set(record) - {SIGNATURE} if type(record) is dict else set()
    if type(record) is not dict or not required <= fields <= required | {"at", "late"}:
        names = ("restarts", *own)
        listed = ", ".join(f"'{name}'" for name in names[:-1]) + f" and '{names[-1]}'"
        raise AssumptionError(
            f"'{OLLP_FIELD}' must be an object with {listed} (perhaps 'at' and "
            f"'late', and 'sig' in a step the engine re-sequenced)"
        )
    restarts = record["restarts"]
    if type(restarts) is not int or not 0 <= restarts <= MAX_RESTARTS + MAX_LATE_RESTARTS:
        raise AssumptionError(
            f"'{OLLP_FIELD}.restarts' must be an integer from 0 to {MAX_RESTARTS + MAX_LATE_RESTARTS}"
        )
    late, at = record.get("late", 0), record.get("at", 0)
    if type(late) is not int or not 0 <= late <= min(restarts, MAX_LATE_RESTARTS):
        raise AssumptionError(
            f"'{OLLP_FIELD}.late' must be an integer from 0 to 'restarts' (at most {MAX_LATE_RESTARTS})"
        )
    if type(at) is not int or at < 0:
        raise AssumptionError(f"'{OLLP_FIELD}.at' must be a time in milliseconds")


def assumed_values(record: Any, keys: tuple) -> dict:
    """The OLLP record's assumptions as {key: value}, checked against the keys."""
    _checked_step(record, ("assumed",))
    assumed = record["assumed"]
    if type(assumed) is not list or len(assumed) != len(keys):
        raise AssumptionError(f"'{OLLP_FIELD}.assumed' must list one value per reconnaissance key ({len(keys)})")
    return dict(zip(keys, assumed))


def found_sets(record: Any) -> tuple[tuple, tuple]:
    """The read and write sets in the record of a procedure without ANALYZE, checked."""
    _checked_step(record, ("reads", "writes"))
    sets = []
    for name in ("reads", "writes"):
        keys = record[name]
        if type(keys) is not list or not all(type(k) is list and len(k) == 2 and type(k[0]) is str for k in keys):
            raise AssumptionError(f"'{OLLP_FIELD}.{name}' must list keys as [table, key] pairs")
        found = tuple((table, normal_key(key)) for table, key in keys)
        try:
            for table, key in found:
                encode_key(table, key)
        except Exception as exc:
            raise AssumptionError(f"'{OLLP_FIELD}.{name}': {exc}") from None
        sets.append(tuple(dict.fromkeys(found)))
    return sets[0], sets[1]


def wire_normal(value: Any) -> Any:
    """`value` as it comes back from a JSON request: the form assumptions are kept in, so an
    assumption compares the same whether it came through Kafka or not."""
    if value is None or type(value) in (int, str, bool):
        return value
    return json.loads(_dumps(value))


def check_turn(procedure, args: dict, snapshot: dict, defaults: dict, now: int) -> tuple[str, Any, str | None] | None:
    """At the transaction's turn (`now`: its batch's time): None if it may run (its
    assumptions hold), else its decision: re-sequenced with the values read now, or
    rejected past the bound."""
    plain, record = split_args(args)
    keys = reconnaissance_keys(procedure, plain)
    current = []
    for table, key in keys:
        value = snapshot.get(encode_key(table, key), ABSENT)
        current.append(wire_normal(defaults.get(table, 0) if value is ABSENT else value))
    if record is not None and all(encode_value(a) == encode_value(c) for a, c in zip(record["assumed"], current)):
        return None
    return _next_step(
        procedure, plain, record, {"assumed": current}, now, "the values its keys depend on changed before its turn"
    )


def found_step(
    procedure, plain: dict, record: dict | None, read: Iterable[bytes], written: Iterable[bytes], now: int
) -> tuple[str, Any, str | None]:
    """A procedure without ANALYZE whose run at its turn reached keys outside its sets:
    re-sequenced with the keys of its record (its earlier runs) and the encoded keys this
    run read and wrote, or rejected past the bound. The sets only grow, so a run that
    follows another path next time still finds what the earlier ones needed."""
    sets = []
    for name, touched in (("reads", read), ("writes", written)):
        known = [encode_key(table, normal_key(key)) for table, key in record[name]] if record is not None else []
        sets.append([_as_json(*decode_key(key)) for key in dict.fromkeys([*known, *touched])])
    return _next_step(
        procedure,
        plain,
        record,
        {"reads": sets[0], "writes": sets[1]},
        now,
        "its run reached keys outside those found for it",
    )


def _as_json(table: str, key: Any) -> list:
    """A (table, key) pair as JSON carries it: a composite key (a flat tuple) as a list."""
    return [table, list(key) if type(key) is tuple else key]


def _next_step(
    procedure, plain: dict, record: dict | None, found: dict, now: int, why: str
) -> tuple[str, Any, str | None]:
    """The request re-sequenced with what its turn `found`, or rejected past the bound."""
    if record is not None:
        restarts = record["restarts"] + 1
        late = record.get("late", 0)
        if now - record.get("at", now) > LATE_MS and late < MAX_LATE_RESTARTS:
            late += 1  # it lost its race to a backlog: not counted
        if restarts - late > MAX_RESTARTS:
            not_counted = f", not counting {late} after a wait of over {LATE_MS} ms" if late else ""
            return (
                "rejected",
                None,
                f"{procedure.name}: {why} {restarts} times in a row (limit {MAX_RESTARTS} restarts{not_counted})",
            )
    else:
        restarts = late = 0
    step = {"restarts": restarts, **found, "at": now, "late": late}
    return RESTARTED, {"proc": procedure.name, "args": {**plain, OLLP_FIELD: step}}, None
