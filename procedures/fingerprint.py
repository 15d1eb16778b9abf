"""What a procedure set means, in a form that can travel in the log: every procedure's
name with a digest of its argument specification and of its code, and every table's
settings; and the set's identity, one number that every batch carries.

A procedure's code is what its functions reach (procedures/reach.py): the statements of
their modules they name and every module of the user's project those import, found without
the user naming them, plus any module the app names in `code=` (ordo.App) or `CODE` (a
procedures module). Ordo's own modules are not covered (except the built-in workloads): an
upgrade of Ordo itself never changes an identity. The interpreter and the installed
libraries the code imports are the set's environment (procedures/environment.py), part of
its description from form 4 on. Source is compared as its syntax tree, so the digest is the
same in every process (docs/operations.md, "Upgrading procedures"). A log keeps the form its
set was described in (FORMATS).

A sequencer records the described set in its start record and an upgrade in an upgrade
record (log/records.py), and stamps every batch with the set's identity; an engine runs
a batch only with the set it was sequenced with, because a request the sequencer accepted
must mean the same thing to every engine that replays it."""

from __future__ import annotations

import dataclasses
import copy
import hashlib
import importlib.util
import sys
import sysconfig
from typing import Any, Iterable

from ordo.procedures.environment import environment, environment_changes
from ordo.procedures.reach import Reach, reach_of
from ordo.procedures.registry import Registry, callables_of

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


KINDS = ("procedures", "tables", "sources")  # what a described set names, each by name
# How a described set's digests cover code: 4, the code each procedure reaches
# (procedures/reach.py) and the set's environment (procedures/environment.py); 3, that code
# alone; 2, the whole source of the modules it is declared in. A set without "format" covers
# arguments only. A log keeps the form it was started or last upgraded in.
FORMAT = 4
FORMATS = (2, 3, 4)
ENVIRONMENT = "environment"  # the key of a described set's environment (form 4 on)


def describe(registry: Registry, code: bool = True, form: int = FORMAT) -> dict:
    """Every procedure's argument schema (and the dataflow composed into it, whether its
    sets are declared or found by running it, and its code) and every table's settings,
    each as a digest of its description by value. `code=False`: the arguments-only form
    that logs written before procedure sets were versioned hold; `form`: how code is
    covered (FORMATS).

    Worked out once per registry: the code a registry runs is what was imported when it
    was loaded, so its files edited on disk since (before an upgrade in place) must not
    change what it is said to be."""
    shape = (code, form, tuple(registry.procedures), tuple(registry.tables), tuple(registry.sources))
    memo = registry.__dict__.setdefault("_described", {})
    if shape not in memo:
        memo[shape] = _describe(registry, code, form)
    return copy.deepcopy(memo[shape])


def _describe(registry: Registry, code: bool, form: int) -> dict:
    installed: set[str] = set()  # the libraries' modules the procedures and sources import
    procedures = {}
    for name, procedure in sorted(registry.procedures.items()):
        try:
            text = by_value(sorted(procedure.args.items()))
            if procedure.dataflow is not None:
                text += " " + (
                    procedure.dataflow
                    if not code
                    else _without_modules(procedure.dataflow, registry.code.get(name, ()))
                )
        except ValueError as exc:
            raise ValueError(
                f"procedure '{name}': its argument schema cannot be compared across processes: {exc}"
            ) from None
        text += "" if procedure.analyze is not None else " home"
        if code:
            text += " code " + (
                code_digest(registry.code.get(name, ()))
                if form == 2
                else _reach_digest(reach_of(registry.roots.get(name, ()), registry.named_code.get(name, ())), installed)
            )
        procedures[name] = _digest(text)
    described = {
        "procedures": procedures,
        "tables": {name: _digest(by_value(t)) for name, t in sorted(registry.tables.items())},
    }
    if registry.sources:  # a set without sources is described as before them
        described["sources"] = {
            topic: _source_digest(registry, topic, code, form, installed)
            for topic, source in sorted(registry.sources.items())
        }
    if code:
        described["format"] = form
    if code and form >= 4:
        described[ENVIRONMENT] = environment(installed)
    return described


def describe_as(registry: Registry, logged: dict | None) -> dict:
    """`registry` described in the form of a logged set (the newest form for none)."""
    if logged is not None and not is_versioned(logged):
        return describe(registry, code=False)
    return describe(registry, form=FORMAT if logged is None else logged["format"])


def identities(registry: Registry) -> set[int]:
    """The set's identity in every form that covers code: a batch stamped with any of them
    was sequenced with this code."""
    return {set_id(describe(registry, form=form)) for form in FORMATS}


def _source_digest(registry: Registry, topic: str, code: bool, form: int, installed: set[str]) -> str:
    """A source's topic, procedure and mapping: its functions by name (without their
    module's, covered by source) and, with `code`, the code of their modules."""
    source, modules = registry.sources[topic], registry.source_code.get(topic, ())
    text = by_value(source)
    if code:
        text = _without_modules(text, modules) + " code "
        if form == 2:
            text += code_digest(modules)
        else:
            named = registry.source_named_code.get(topic, ())
            text += _reach_digest(reach_of(callables_of(source), named), installed)
    return _digest(text)


def _reach_digest(reach: Reach, installed: set[str]) -> str:
    """By what the code reaches, not by the modules' names: an earlier version kept as
    another module (bank_v1.py beside bank.py) is still that version. The libraries' modules
    it imports are added to `installed`."""
    installed.update(reach.installed)
    return _digest(" ".join(sorted(reach.digests().values())))


def is_versioned(described: dict | None) -> bool:
    """Whether a logged set covers code (written by a versioning sequencer)."""
    return bool(described) and described.get("format") in FORMATS


def set_id(described: dict) -> int:
    """The identity of a described procedure set: what every batch carries (64 bits)."""
    return int.from_bytes(hashlib.blake2b(by_value(described).encode(), digest_size=8).digest(), "big")


def short(identity: int | None) -> str:
    """How messages name a procedure set."""
    return "unknown" if identity is None else f"{identity:016x}"[:12]


def modules_of(callables: Iterable[Any]) -> set[str]:
    """The modules whose source decides what these callables do: each one's own module,
    Ordo's and Python's own excepted (but Ordo's built-in workloads included)."""
    found = set()
    for item in callables:
        module = getattr(item, "__module__", None)
        if isinstance(module, str) and _is_user_module(module):
            found.add(module)
    return found


def _is_user_module(name: str) -> bool:
    if name.startswith("ordo.procedures.workloads."):
        return True
    if name == "ordo" or name.startswith("ordo.") or name in sys.stdlib_module_names:
        return False
    return name.split(".")[0] not in sys.stdlib_module_names and name != "builtins"


def code_digest(modules: Iterable[str]) -> str:
    """By the modules' sources only, not their names: an earlier version kept as another
    module (bank_v1.py beside bank.py) is still that version."""
    return _digest(" ".join(sorted({module_source_digest(name) for name in modules})))


def _without_modules(text: str, modules: Iterable[str]) -> str:
    """A dataflow's description names its triggers by import path; their code is covered
    by source, so the module part goes (longest first, so a package never hides a module)."""
    for module in sorted(modules, key=len, reverse=True):
        text = text.replace(module + ".", "")
    return text


def module_source_digest(name: str) -> str:
    """A digest of a module's source text (line endings normalised); a module without
    source (compiled, built in) is named by its name alone."""
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None) if module is not None else None
    if path is None:
        spec = importlib.util.find_spec(name)
        path = spec.origin if spec is not None else None
    if not path or not path.endswith(".py") or path.startswith(sysconfig.get_paths()["stdlib"]):
        return "no-source"
    with open(path, "rb") as source:
        return _digest(source.read().replace(b"\r\n", b"\n").decode("utf-8", "replace"))


def differences(logged: dict, engine: dict) -> list[str]:
    """What the logged set has that the engine lacks or defines otherwise. An engine may
    know more procedures and tables than the log names (adding one is an upgrade)."""
    problems = []
    for kind in KINDS:
        ours = engine.get(kind, {})
        for name, digest in sorted(logged.get(kind, {}).items()):
            if name not in ours:
                problems.append(f"{kind[:-1]} '{name}' is missing")
            elif ours[name] != digest:
                problems.append(f"{kind[:-1]} '{name}' is defined differently")
    return problems


def changes(logged: dict, ours: dict, together: Iterable[Iterable[str]] = ()) -> list[str]:
    """How `ours` differs from the logged set, both ways: what an upgrade from one to the
    other adds, changes and removes. `together`: procedures identified by their code
    together (`code_groups`); those of a group that changed are one item, saying why, as an
    edit to one of them changes them all."""
    group_of = {name: frozenset(group) for group in map(frozenset, together) for name in group}
    found: list[str] = []
    said: set[str] = set()
    for kind in KINDS:
        before, after = logged.get(kind, {}), ours.get(kind, {})
        for name in sorted(set(before) | set(after)):
            if name not in after:
                found.append(f"{kind[:-1]} '{name}' removed")
            elif name not in before:
                found.append(f"{kind[:-1]} '{name}' added")
            elif before[name] == after[name] or name in said:
                continue
            elif kind == "procedures" and name in group_of:
                changed = sorted(n for n in group_of[name] if n in before and n in after and before[n] != after[n])
                said.update(changed)
                found.append(_changed_together(changed))
            else:
                found.append(f"{kind[:-1]} '{name}' changed")
    if ENVIRONMENT in logged and ENVIRONMENT in ours:
        found.extend(environment_changes(logged[ENVIRONMENT], ours[ENVIRONMENT]))
    return found


def _changed_together(names: list[str]) -> str:
    if len(names) == 1:
        return f"procedure '{names[0]}' changed"
    listed = ", ".join(f"'{n}'" for n in names[:-1]) + f" and '{names[-1]}'"
    return (
        f"procedures {listed} changed (procedures of the app's dataflows, identified by the code of "
        f"all of them together: an edit to any one changes each)"
    )


def code_groups(registry: Registry) -> list[set[str]]:
    """The procedures identified by the same code, in groups of two or more: a workload's
    dataflow procedures each reach the code of all of them (Registry.add_workload)."""
    by_roots: dict[tuple, set[str]] = {}
    for name in registry.procedures:
        by_roots.setdefault((registry.roots.get(name, ()), registry.named_code.get(name, ())), set()).add(name)
    return [group for group in by_roots.values() if len(group) > 1]


def shown(items: list[str], limit: int = 5) -> str:
    return "; ".join(items[:limit]) + (f"; and {len(items) - limit} more" if len(items) > limit else "")


class ProcedureSetMismatch(RuntimeError):
    """The engine's procedures are not those the log was sequenced with."""


class ProcedureSetChanged(RuntimeError):
    """A sequencer's procedure set is not the one the log runs: starting it would change
    what the log means without an upgrade record."""


class VersionBoundary(RuntimeError):
    """The log moved to a procedure set this engine does not run: it stopped before the
    first batch of that set, everything before applied."""

    def __init__(self, message: str, batch: int, identity: int, version: int | None):
        super().__init__(message)
        self.batch, self.identity, self.version = batch, identity, version


WAY_OUT = (
    "run the engine with the procedures the sequencer had (the same --app, --procedures and --workloads); "
    "see docs/operations.md, 'Upgrading procedures'"
)


def refused_entry(batch_id: int, index: int, request_id, reason: str) -> ProcedureSetMismatch:
    """An entry the sequencer accepted fails this engine's validation: executing on would
    reject what the sequencer's procedures accepted, a silent divergence."""
    return ProcedureSetMismatch(
        f"batch {batch_id}, entry {index}: the sequencer accepted request {request_id!r}, which this "
        f"engine refuses ({reason}): {WAY_OUT}"
    )


def refused_start(problems: list[str]) -> ProcedureSetMismatch:
    return ProcedureSetMismatch(
        f"the log was sequenced with procedures this engine lacks ({shown(problems)}): {WAY_OUT}"
    )
