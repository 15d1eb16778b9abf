"""What a procedure set runs on beside the project's own code: the interpreter, and every
installed library its procedures import (a module that is neither Python's own, nor Ordo's,
nor the project's: procedures/reach.py), each by its distribution's name and version and a
digest of the modules the code names.

A procedure's outcome depends on these as much as on its source: a library whose `f(v)`
became `2 * v` makes a replay compute other outcomes from the same log. So a described set
(form 4, procedures/fingerprint.py) holds its environment, and a process whose environment
differs runs none of the set's batches and says what differs.

What it cannot cover: what a library itself imports (covered by its distribution's version
only), native code loaded by other means, data files read at run time, and the state of the
machine. Ordo itself is the engine, not part of a procedure: it is not covered.

An installed module is digested once per process, the first time a set names it, and kept:
a process goes on running the module it imported, whatever is installed since, so what the
set is said to run stays what it runs."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import sys
import threading
from typing import Iterable

from ordo.procedures.reach import module_digest

PYTHON = "python"
UNVERSIONED = "unversioned"  # a module that no installed distribution lists

_lock = threading.Lock()
_seen: dict[str, str] = {}  # module -> its digest, as first seen by this process
_versions: dict[str, str] = {}  # distribution -> its version, as first seen by this process


def interpreter() -> str:
    """The interpreter, as a set records it: 'cpython 3.11.9'."""
    return f"{sys.implementation.name} {platform.python_version()}"


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distribution_of(module: str) -> str | None:
    """The installed distribution that provides `module`'s top-level package, or None."""
    found = _distributions().get(module.split(".")[0])
    return sorted(found)[0] if found else None


def _version(distribution: str) -> str:
    with _lock:
        if distribution not in _versions:
            try:
                _versions[distribution] = importlib.metadata.version(distribution)
            except importlib.metadata.PackageNotFoundError:
                _versions[distribution] = UNVERSIONED
        return _versions[distribution]


def _module_digest(module: str) -> str:
    with _lock:
        if module not in _seen:
            _seen[module] = module_digest(module)
        return _seen[module]


def environment(modules: Iterable[str]) -> dict:
    """The environment of code that imports the installed `modules`: the interpreter, and
    per distribution (by its name; a module no distribution lists, by its own) its version
    and each named module's digest. Keys sorted, so every process describes it alike."""
    libraries: dict[str, dict] = {}
    for module in sorted(set(modules)):
        distribution = distribution_of(module)
        entry = libraries.setdefault(
            distribution or module.split(".")[0],
            {"version": _version(distribution) if distribution else UNVERSIONED, "modules": {}},
        )
        entry["modules"][module] = _module_digest(module)
    return {PYTHON: interpreter(), "libraries": {name: libraries[name] for name in sorted(libraries)}}


def environment_changes(logged: dict | None, ours: dict | None) -> list[str]:
    """What differs between the environment a set was described in and this one, in words:
    'library mylib 1.0 -> 2.0', 'library mylib 1.0: module mylib.pricing differs'."""
    if logged is None or ours is None:
        return [] if logged == ours else ["the environment is recorded on one side only"]
    found = []
    if logged.get(PYTHON) != ours.get(PYTHON):
        found.append(f"interpreter {logged.get(PYTHON)} -> {ours.get(PYTHON)}")
    before, after = logged.get("libraries", {}), ours.get("libraries", {})
    for name in sorted(set(before) | set(after)):
        was, now = before.get(name), after.get(name)
        if now is None:
            found.append(f"library {name} {was['version']} no longer imported")
        elif was is None:
            found.append(f"library {name} {now['version']} imported")
        elif was["version"] != now["version"]:
            found.append(f"library {name} {was['version']} -> {now['version']}")
        else:
            differing = sorted(
                m for m in set(was["modules"]) | set(now["modules"]) if was["modules"].get(m) != now["modules"].get(m)
            )
            if differing:
                found.append(f"library {name} {now['version']}: module {', '.join(differing)} differs")
    return found


def differences_here(logged: dict) -> list[str]:
    """How this process differs from the environment `logged` records, for the libraries it
    names: what an engine that imported a library before it changed would run."""
    modules = [module for library in logged.get("libraries", {}).values() for module in library["modules"]]
    return environment_changes(logged, environment(modules))
