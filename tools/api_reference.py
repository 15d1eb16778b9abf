"""docs/api.md, generated from the docstrings of Ordo's public API (`ordo.__all__`).

    python tools/api_reference.py           # write docs/api.md
    python tools/api_reference.py --check   # exit 1 if a public name is undocumented or docs/api.md is stale

Every public name, and every public method and property of a public class, must have a
docstring: the reference is only as complete as they are.
"""

from __future__ import annotations

import inspect
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT = os.path.join(ROOT, "docs", "api.md")

# The reference's sections, in order: each public name falls in the first whose module it is from.
SECTIONS = [
    ("Apps: tables and procedures", "ordo.app"),
    ("RUN's context", "ordo.procedures.contract"),
    ("Argument types", "ordo.procedures.args"),
    ("Existing topics as sources", "ordo.procedures.sources"),
    ("The client", "ordo.client"),
    ("What the client reads back", "ordo.reading"),
    ("Reading the state", "ordo.live_reads"),
    ("Testing in-process", "ordo.testing"),
    ("Errors", "ordo.errors"),
]

HEADER = """# API reference

Generated from the docstrings by `python tools/api_reference.py` (do not edit by hand; a
test fails when this file and the code disagree). Every name here is importable from
`ordo` itself (`ordo.App`, `from ordo import Client`). The guides say how the pieces fit:
[procedures.md](procedures.md), [client.md](client.md), [streaming.md](streaming.md).
"""


def public_members(cls: type) -> list[tuple[str, object]]:
    """The methods and properties a user calls: defined on the class itself, not private,
    in source order."""
    members = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue  # __init__: the class's own signature and docstring stand for it
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            members.append((name, value))
    return members


class _Written(str):
    """An annotation as the source writes it (postponed annotations are strings): shown
    without the quotes repr would add."""

    def __repr__(self) -> str:
        return str(self)


def _signature(obj, method: bool = False) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""

    def written(annotation):
        return _Written(annotation) if isinstance(annotation, str) else annotation

    parameters = [p.replace(annotation=written(p.annotation)) for p in signature.parameters.values()]
    if method:
        parameters = parameters[1:]  # self
    returns = inspect.Signature.empty if inspect.isclass(obj) else written(signature.return_annotation)
    return str(signature.replace(parameters=parameters, return_annotation=returns))


def _doc(obj) -> str | None:
    doc = inspect.getdoc(obj)
    return doc.strip() if doc else None


def _own_doc(cls: type) -> str | None:
    """The class's own docstring (a dataclass's generated one is its signature, not a doc)."""
    doc = cls.__dict__.get("__doc__")
    if not doc or doc.startswith(cls.__name__ + "("):
        return None
    return inspect.cleandoc(doc)


def generate() -> tuple[str, list[str]]:
    """(the reference's text, what is undocumented)."""
    import ordo

    missing: list[str] = []
    names = [n for n in ordo.__all__ if not n.startswith("_")]
    placed = {
        n: next((title for title, module in SECTIONS if getattr(ordo, n).__module__ == module), None) for n in names
    }
    missing += [
        f"ordo.{n}: its module has no section in tools/api_reference.py" for n, t in placed.items() if t is None
    ]
    out = [HEADER]
    for title, _ in SECTIONS:
        members = [n for n in names if placed[n] == title]
        if not members:
            continue
        out.append(f"## {title}\n")
        for name in members:
            obj = getattr(ordo, name)
            if inspect.isclass(obj):
                doc = _own_doc(obj)
                bases = [b.__name__ for b in obj.__bases__ if b is not object]
                protocol = getattr(obj, "_is_protocol", False)  # a type to annotate with, never made by users
                heading = f"class ordo.{name}" + (
                    f"({', '.join(bases)})" if issubclass(obj, BaseException) else "(Protocol)" if protocol else ""
                )
                out.append(f"### `{heading}`\n")
                if not issubclass(obj, BaseException) and not protocol:
                    out.append(f"```python\nordo.{name}{_signature(obj)}\n```\n")
            else:
                doc = _doc(obj)
                out.append(f"### `ordo.{name}`\n")
                out.append(f"```python\nordo.{name}{_signature(obj)}\n```\n")
            if doc is None:
                missing.append(f"ordo.{name}")
            out.append((doc or "") + "\n")
            if inspect.isclass(obj) and not issubclass(obj, BaseException):
                for member, value in public_members(obj):
                    target = value.fget if isinstance(value, property) else value
                    member_doc = _doc(target)
                    if member_doc is None:
                        missing.append(f"ordo.{name}.{member}")
                    if isinstance(value, property):
                        out.append(f"#### `{name}.{member}` (property)\n")
                    else:
                        prefix = (
                            "async " if inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value) else ""
                        )
                        out.append(f"#### `{prefix}{name}.{member}{_signature(value, method=True)}`\n")
                    out.append((member_doc or "") + "\n")
    return "\n".join(out).rstrip("\n") + "\n", missing


def main(argv: list[str]) -> int:
    sys.path.insert(0, ROOT)
    text, missing = generate()
    if missing:
        print(f"undocumented public names: {', '.join(missing)}", file=sys.stderr)
        return 1
    if "--check" in argv:
        try:
            with open(OUTPUT) as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != text:
            print(f"{os.path.relpath(OUTPUT, ROOT)} is out of date: run python tools/api_reference.py", file=sys.stderr)
            return 1
        return 0
    with open(OUTPUT, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
