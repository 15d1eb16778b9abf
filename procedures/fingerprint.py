"""What a procedure set means, in a form that can travel in the log: every procedure's
name with a digest of its argument specification, and every table's settings.

A sequencer records this in its start record; an engine compares it with its own set
before following the batches, because a request the sequencer accepted must mean the
same thing to every engine that replays it."""

from __future__ import annotations

import hashlib

from procedures.registry import Registry


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def describe(registry: Registry) -> dict:
    return {
        "procedures": {name: _digest(repr(sorted(p.args.items())) + ("" if p.analyze is not None else " home"))
                       for name, p in sorted(registry.procedures.items())},
        "tables": {name: _digest(repr(t)) for name, t in sorted(registry.tables.items())},
    }


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
