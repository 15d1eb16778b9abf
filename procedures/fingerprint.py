"""What a procedure set means, in a form that can travel in the log: every procedure's
name with a digest of its argument specification, and every table's settings.

A sequencer records this in its start record; an engine compares it with its own set
before following the batches, because a request the sequencer accepted must mean the
same thing to every engine that replays it."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from ordo.procedures.registry import Registry

_SCALARS = (int, str, float, bool, bytes, type(None))


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def by_value(value: Any) -> str:
    """`value` described by what it holds, the same in every process: what `repr` gives for
    scalars, containers and dataclasses, a function by its import path, a set in sorted
    order. Anything else (an object whose description would be its memory address) is a
    ValueError, so two processes can never silently disagree."""
    kind = type(value)
    if kind in _SCALARS:
        return repr(value)
    if kind is dict:
        return "{" + ", ".join(f"{by_value(k)}: {by_value(v)}" for k, v in value.items()) + "}"
    if kind is list:
        return "[" + ", ".join(map(by_value, value)) + "]"
    if kind is tuple:
        inner = ", ".join(map(by_value, value))
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if kind in (set, frozenset):
        return f"{kind.__name__}({sorted(map(by_value, value))!r})"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(f"{f.name}={by_value(getattr(value, f.name))}" for f in dataclasses.fields(value) if f.repr)
        return f"{kind.__qualname__}({fields})"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
    raise ValueError(f"{kind.__qualname__} has no description by value (make it a dataclass)")


def describe(registry: Registry) -> dict:
    """Every procedure's argument schema (and the dataflow composed into it, and whether
    its sets are declared or found by running it) and every table's settings, each as a
    digest of its description by value."""
    procedures = {}
    for name, procedure in sorted(registry.procedures.items()):
        try:
            text = by_value(sorted(procedure.args.items()))
            if procedure.dataflow is not None:
                text += " " + procedure.dataflow
        except ValueError as exc:
            raise ValueError(f"procedure '{name}': its argument schema cannot be compared across processes: "
                             f"{exc}") from None
        procedures[name] = _digest(text + ("" if procedure.analyze is not None else " home"))
    return {"procedures": procedures,
            "tables": {name: _digest(by_value(t)) for name, t in sorted(registry.tables.items())}}


def differences(logged: dict, engine: dict) -> list[str]:
    """What the logged set has that the engine lacks or defines otherwise. An engine may
    know more procedures and tables than the log names (adding one is an upgrade)."""
    problems = []
    for kind in ("procedures", "tables"):
        ours = engine.get(kind, {})
        for name, digest in sorted(logged.get(kind, {}).items()):
            if name not in ours:
                problems.append(f"{kind[:-1]} '{name}' is missing")
            elif ours[name] != digest:
                problems.append(f"{kind[:-1]} '{name}' is defined differently")
    return problems


class ProcedureSetMismatch(RuntimeError):
    """The engine's procedures are not those the log was sequenced with."""


WAY_OUT = ("run the engine with the procedures the sequencer had (the same --app, --procedures and --workloads); "
           "see docs/operations.md, 'Procedure change'")


def refused_entry(batch_id: int, index: int, request_id, reason: str) -> ProcedureSetMismatch:
    """An entry the sequencer accepted fails this engine's validation: executing on would
    reject what the sequencer's procedures accepted, a silent divergence."""
    return ProcedureSetMismatch(
        f"batch {batch_id}, entry {index}: the sequencer accepted request {request_id!r}, which this "
        f"engine refuses ({reason}): {WAY_OUT}")


def refused_start(problems: list[str]) -> ProcedureSetMismatch:
    shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    return ProcedureSetMismatch(f"the log was sequenced with procedures this engine lacks ({shown}): {WAY_OUT}")
