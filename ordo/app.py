"""An application: its tables and stored procedures, declared with decorators and run with
`ordo run --app module:app`.

    app = ordo.App("bank")
    accounts = app.table("account", default=0)

    @app.procedure(args={"account": Int(0), "amount": Int(1)})
    class deposit:
        def analyze(args):
            key = ("account", args["account"])
            return [key], [key]

        def run(ctx, args):
            ctx.write("account", args["account"], ctx.read("account", args["account"]) + args["amount"])

A procedure is a class with `analyze` and `run` (and optionally `operations`, the form the
operation-chain scheduler uses, and `reconnoiter`, docs/procedures.md), or a RUN function
with `analyze=` given to the decorator. Without analyze, it names its `home` instead and
runs only under --scheduler aria:

    @app.procedure(args={"src": Int(0), "dst": Int(0)}, home=("account", "src"))
    def transfer(ctx, args): ...

Mistakes fail when the module is imported, not when the first request arrives.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable

from procedures.args import Int, List, Str
from procedures.contract import Procedure, Table
from procedures.registry import Registry

FIELD_TYPES = (Int, Str, List)
PARTS = ("analyze", "run", "operations", "reconnoiter", "home")


class App:
    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise TypeError("App needs a name, e.g. ordo.App('bank')")
        self.name = name
        self._tables: dict[str, Table] = {}
        self._procedures: dict[str, Procedure] = {}

    # -- the module form's view: what `ordo run --app module:app` loads --------------------

    @property
    def TABLES(self) -> list[Table]:  # noqa: N802 (the same names as a procedures module)
        return list(self._tables.values())

    @property
    def PROCEDURES(self) -> list[Procedure]:  # noqa: N802
        return list(self._procedures.values())

    def registry(self, *workloads: str) -> Registry:
        """This app's procedures, plus the named built-in workloads (`"sl"`, …) if any."""
        from procedures.loading import load_spec, workload_spec

        registry = Registry()
        registry.add_workload(self.TABLES, self.PROCEDURES)
        for name in workloads:
            registry.add_workload(*load_spec(workload_spec(name)))
        return registry

    # -- declarations ------------------------------------------------------------------------

    def table(self, name: str, *, default: Any = 0, partitioner: str = "hash",
              partition_by: int | None = None) -> Table:
        """Declare a table: the value a never-written key reads as, and how its keys map to
        partitions ("hash", "modulo", or `partition_by=i` for composite keys)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"app '{self.name}': a table needs a name, e.g. app.table('account')")
        table = Table(name, default, partitioner, partition_by)
        existing = self._tables.get(name)
        if existing is not None and existing != table:
            raise ValueError(f"app '{self.name}': table '{name}' declared twice with different settings")
        self._tables[name] = table
        return table

    def procedure(self, name: str | None = None, *, args: dict | None = None,
                  analyze: Callable | None = None, operations: Callable | None = None,
                  reconnoiter: Callable | None = None, home: tuple | Callable | None = None) -> Callable:
        """Decorator: `@app.procedure(args={...})` over a class with `analyze` and `run`,
        or over a RUN function with `analyze=`; without analyze, with `home=` (a (table,
        argument name) pair or a function of the arguments giving (table, key)) for aria.
        The procedure's name is the class's or function's unless `name` is given. Returns
        the registered `Procedure`."""
        if callable(name):
            raise TypeError(f"app '{self.name}': write @app.procedure(args={{...}}), with the argument "
                            f"schema, not a bare @app.procedure over '{getattr(name, '__name__', name)}'")
        if args is None:
            raise TypeError(f"app '{self.name}': @app.procedure needs args={{name: Int() | Str() | List(...)}} "
                            f"(args={{}} for none)")
        schema = self._schema(name, args)

        def register(target: Any) -> Procedure:
            proc_name = name or getattr(target, "__name__", None)
            if not isinstance(proc_name, str) or not proc_name:
                raise TypeError(f"app '{self.name}': cannot name the procedure {target!r}; give name=")
            parts = self._parts(proc_name, target, analyze, operations, reconnoiter, home)
            if proc_name in self._procedures:
                raise ValueError(f"app '{self.name}': procedure '{proc_name}' declared twice")
            try:
                procedure = Procedure(proc_name, schema, parts.get("analyze"), parts["run"], parts.get("operations"),
                                      parts.get("reconnoiter"), parts.get("home"))
            except TypeError as exc:
                raise TypeError(f"app '{self.name}', {exc}") from None
            self._procedures[proc_name] = procedure
            return procedure

        return register

    def _schema(self, name: str | None, args: Any) -> dict:
        where = f"app '{self.name}', procedure '{name}'" if name else f"app '{self.name}'"
        if not isinstance(args, dict):
            raise TypeError(f"{where}: args must be a dict of argument name to Int(), Str() or List(...)")
        for arg, field in args.items():
            if not isinstance(arg, str) or not isinstance(field, FIELD_TYPES):
                raise TypeError(f"{where}: args[{arg!r}] must be Int(), Str() or List(...), got {field!r}")
        return dict(args)

    def _parts(self, proc_name: str, target: Any, analyze, operations, reconnoiter, home) -> dict[str, Callable]:
        where = f"app '{self.name}', procedure '{proc_name}'"
        if isinstance(target, type):
            given = {"analyze": analyze, "operations": operations, "reconnoiter": reconnoiter, "home": home}
            parts = {part: vars(target)[part] for part in PARTS if part in vars(target)}
            for part, value in given.items():
                if value is not None:
                    parts[part] = value
            parts = {part: (value.__func__ if isinstance(value, staticmethod) else value)
                     for part, value in parts.items()}
            own = [n for n in vars(target) if not n.startswith("__")]
            for unknown in (n for n in own if n not in PARTS):
                close = difflib.get_close_matches(unknown, PARTS, n=1, cutoff=0.6)
                if close and close[0] not in vars(target):
                    raise TypeError(f"{where}: '{unknown}' is not a part of a procedure; did you mean "
                                    f"'{close[0]}'? (parts: {', '.join(PARTS)})")
            missing = [part for part in ("analyze", "run") if part not in parts
                       and not (part == "analyze" and "home" in parts)]
            if missing:
                raise TypeError(f"{where}: the class needs {' and '.join(missing)} "
                                f"(def analyze(args) -> (reads, writes), or home = (table, argument) for "
                                f"--scheduler aria; def run(ctx, args))")
        elif callable(target):
            if analyze is None and home is None:
                raise TypeError(f"{where}: a RUN function needs analyze= in the decorator, or home= to run "
                                f"without analyze under --scheduler aria (or decorate a class with analyze and run)")
            parts = {"run": target, "analyze": analyze, "operations": operations, "reconnoiter": reconnoiter,
                     "home": home}
        else:
            raise TypeError(f"{where}: @app.procedure decorates a class or a function, not {target!r}")
        for part, value in parts.items():
            if part != "home" and value is not None and not callable(value):
                raise TypeError(f"{where}: {part} must be a function, got {value!r}")
        return {part: value for part, value in parts.items() if value is not None}

    def __repr__(self) -> str:
        return f"App({self.name!r}: {len(self._tables)} tables, {len(self._procedures)} procedures)"
