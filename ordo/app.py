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
with `analyze=` given to the decorator, or with its keys given as argument paths
(`keys=`, `reads=`, `writes=`), from which Ordo derives ANALYZE. Without any of these, it
names its `home` instead, and Ordo finds its keys by running it (docs/procedures.md,
"Without ANALYZE"):

    @app.procedure(args={"src": Int(0), "dst": Int(0)}, home=("account", "src"))
    def transfer(ctx, args): ...

Streams, windows and nested transactions (`app.stream`, `app.window`, `app.nested`,
docs/streaming.md) chain procedures into dataflows. Mistakes fail when the module is
imported (or, for names that may be declared later, when the app is loaded), not when the
first request arrives.
"""

from __future__ import annotations

import difflib
import sys
from typing import Any, Callable, Iterable, cast

from ordo.procedures.args import FIELD_TYPES, List, key_field_problem
from ordo.procedures.contract import Procedure, Table
from ordo.procedures.registry import Registry, did_you_mean
from ordo.procedures.streams import Nested, Stream, Window

PARTS = ("analyze", "run", "operations", "reconnoiter", "home")
TABLE_SETTINGS = ("default", "partitioner", "partition_by", "range_by")


class App:
    """An application: its tables and stored procedures, declared with the decorators below,
    loaded by `ordo run --app module:app` or `TestEngine(app)`. `name` names it in messages;
    `code`: modules (or their import paths) whose source is part of this app's procedures
    beside the app's own module, e.g. a module of helpers that RUN calls: an edit there then
    needs an upgrade too (docs/operations.md, "Upgrading procedures"); `sources`: existing
    topics whose records become requests (`ordo.Source`)."""

    def __init__(self, name: str, *, code: Iterable[Any] = (), sources: Iterable[Any] = ()):
        """`code`: modules (or their import paths) that are part of this app's procedures
        but cannot be found from their code (the project's modules they import are found),
        e.g. one loaded by name at run time or an installed package of your own: an edit
        there then needs an upgrade too (docs/operations.md, "Upgrading procedures").
        `sources`: `ordo.Source`s, topics the app does not own whose records become
        requests of its procedures (docs/procedures.md, "Existing topics as sources")."""
        if not isinstance(name, str) or not name:
            raise TypeError("App needs a name, e.g. ordo.App('bank')")
        self.name = name
        defined_in = sys._getframe(1).f_globals.get("__name__")
        self._code = [
            *([defined_in] if isinstance(defined_in, str) else []),
            *(m if isinstance(m, str) else getattr(m, "__name__", m) for m in code),
        ]
        for item in self._code:
            if not isinstance(item, str):
                raise TypeError(f"App code= takes modules or import paths, got {item!r}")
        from ordo.procedures.sources import Source

        self._sources = list(sources)
        for item in self._sources:
            if not isinstance(item, Source):
                raise TypeError(f"App sources= takes ordo.Source(topic, proc=…), got {item!r}")
        self._tables: dict[str, Table] = {}
        self._procedures: dict[str, Procedure] = {}
        self._flows: dict[str, Stream | Window | Nested] = {}  # streams, windows, nested, by name
        # The tables each procedure's argument paths name (keys=, reads=, writes=): checked once
        # the module has declared everything, since tables may come after their procedures.
        self._path_tables: dict[str, list[str]] = {}

    # -- the module form's view: what `ordo run --app module:app` loads --------------------

    @property
    def TABLES(self) -> list[Table]:  # noqa: N802 (the same names as a procedures module)
        """The declared tables, as a procedures module lists them."""
        return list(self._tables.values())

    @property
    def PROCEDURES(self) -> list[Procedure]:  # noqa: N802
        """The declared procedures, as a procedures module lists them; raises ValueError if a
        procedure's keys name a table the app does not declare."""
        for proc_name, tables in self._path_tables.items():
            for table in tables:
                if table not in self._tables:
                    raise ValueError(
                        f"app '{self.name}', procedure '{proc_name}': its keys name table '{table}', "
                        f"which the app does not declare{did_you_mean(table, self._tables)} "
                        f"(tables: {', '.join(self._tables) or 'none'})"
                    )
        return list(self._procedures.values())

    @property
    def STREAMS(self) -> list[Stream | Window | Nested]:  # noqa: N802
        """The declared streams, windows and nested transactions."""
        return list(self._flows.values())

    @property
    def CODE(self) -> list[str]:  # noqa: N802
        """The modules given as `code`, beside the app's own, whose source is its procedures' code."""
        return list(self._code)

    @property
    def SOURCES(self) -> list:  # noqa: N802
        """The topics whose records become requests (`sources=`)."""
        return list(self._sources)

    def registry(self, *workloads: str) -> Registry:
        """This app's procedures, plus the named built-in workloads (`"sl"`, …) if any."""
        from ordo.procedures.loading import load_spec, workload_spec

        registry = Registry()
        try:
            registry.add_workload(self.TABLES, self.PROCEDURES, self.STREAMS, self.CODE, self.SOURCES)
        except ValueError as exc:
            raise ValueError(f"app '{self.name}': {exc}") from None
        for name in workloads:
            registry.add_workload(*load_spec(workload_spec(name)))
        return registry

    # -- declarations ------------------------------------------------------------------------

    def table(
        self,
        name: str | type | None = None,
        *,
        default: Any = 0,
        partitioner: str = "hash",
        partition_by: int | None = None,
        range_by: int | None = None,
    ) -> Table | Callable:
        """Declare a table: the value a never-written key reads as, how its keys map to
        partitions ("hash", "modulo", or `partition_by=i` for composite keys) and, with
        `range_by=k`, that transactions may declare ranges of it (docs/keys.md).
        `app.table("stock", default=0)` returns the Table; as a decorator, `@app.table` (or
        `@app.table(default=…)`) over a class declares the table named after it, its class
        attributes giving the settings."""
        if isinstance(name, type):
            return self._table_class(name, {})
        if name is None:
            given = {"default": default, "partitioner": partitioner, "partition_by": partition_by, "range_by": range_by}
            return lambda target: self._table_class(target, given)
        if not isinstance(name, str) or not name:
            raise TypeError(f"app '{self.name}': a table needs a name, e.g. app.table('account')")
        from ordo.procedures.streams import is_internal_table

        if is_internal_table(name):
            raise ValueError(
                f"app '{self.name}': table '{name}': names starting with 'stream.' or 'window.' are the "
                "engine's own, for output streams and windows (app.stream, app.window)"
            )
        try:
            table = Table(name, default, partitioner, partition_by, range_by)
        except ValueError as exc:
            raise ValueError(f"app '{self.name}': {exc}") from None
        existing = self._tables.get(name)
        if existing is not None and existing != table:
            raise ValueError(f"app '{self.name}': table '{name}' declared twice with different settings")
        self._tables[name] = table
        return table

    def _table_class(self, target: Any, given: dict) -> Table:
        if not isinstance(target, type):
            raise TypeError(f"app '{self.name}': @app.table decorates a class named after the table, not {target!r}")
        own = {n: v for n, v in vars(target).items() if not n.startswith("__")}
        for unknown in (n for n in own if n not in TABLE_SETTINGS):
            close = difflib.get_close_matches(unknown, TABLE_SETTINGS, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise TypeError(
                f"app '{self.name}', table '{target.__name__}': '{unknown}' is not a table setting"
                f"{hint} (settings: {', '.join(TABLE_SETTINGS)})"
            )
        settings = {"default": 0, "partitioner": "hash", "partition_by": None, "range_by": None, **given, **own}
        return cast(Table, self.table(target.__name__, **settings))

    # -- streams (docs/streaming.md) ----------------------------------------------------------

    def stream(
        self,
        name: str,
        *,
        producers: list[str] | tuple = (),
        consumers: list[str] | tuple = (),
        on_insert: Callable | None = None,
    ) -> Stream:
        """A stream from its producers to its consumers (each consumer is triggered by it). No
        producers: an input stream, whose requests carry atomic batches of tuples for its
        consumer; no consumers: an output stream, published as `<ns>.stream.<name>`.
        `on_insert(ctx, tuple)` runs inside the emitting transaction for each tuple."""
        return self._flow(Stream, name, producers=tuple(producers), consumers=tuple(consumers), on_insert=on_insert)

    def window(
        self,
        name: str,
        *,
        owner: str,
        rows: int | None = None,
        slide: int | None = None,
        range_ms: int | None = None,
        slide_ms: int | None = None,
        on_slide: Callable | None = None,
    ) -> Window:
        """A window owned by a procedure of a dataflow: `rows=n, slide=m` (ROWS n SLIDE m) or
        `range_ms=r, slide_ms=s` (by the batch's time)."""
        return self._flow(
            Window, name, owner=owner, rows=rows, slide=slide, range_ms=range_ms, slide_ms=slide_ms, on_slide=on_slide
        )

    def nested(self, name: str, procedures: list[str] | tuple) -> Nested:
        """Triggered procedures that commit or abort as one."""
        return self._flow(Nested, name, procedures=tuple(procedures))

    def _flow(self, kind: type, name: str, **settings):
        if not isinstance(name, str) or not name:
            raise TypeError(f"app '{self.name}': a {kind.__name__.lower()} needs a name")
        if name in self._flows:
            raise ValueError(
                f"app '{self.name}': '{name}' declared twice (streams, windows and nested "
                f"transactions share one namespace)"
            )
        try:
            declared = kind(name, **settings)
        except ValueError as exc:
            raise ValueError(f"app '{self.name}': {exc}") from None
        self._flows[name] = declared
        return declared

    def procedure(
        self,
        name: str | None = None,
        *,
        args: dict | None = None,
        analyze: Callable | None = None,
        operations: Callable | None = None,
        reconnoiter: Callable | None = None,
        keys: list | None = None,
        reads: list | None = None,
        writes: list | None = None,
        home: tuple | Callable | None = None,
    ) -> Callable:
        """Decorator: `@app.procedure(args={...})` over a class with `analyze` and `run`,
        or over a RUN function with `analyze=`, or with its keys as argument paths —
        `keys=` (read and written), `reads=`, `writes=`: lists of `(table, path)` where
        path is an argument's name (a List argument: each of its items) or a tuple of
        names (a composite key) — from which ANALYZE is derived; or, without analyze, with
        `home=` (a (table, argument name) pair or a function of the arguments giving
        (table, key)), whose keys are found by running it. The procedure's name is the class's or function's unless
        `name` is given. Returns the registered `Procedure`."""
        if callable(name):
            raise TypeError(
                f"app '{self.name}': write @app.procedure(args={{...}}), with the argument "
                f"schema, not a bare @app.procedure over '{getattr(name, '__name__', name)}'"
            )
        if args is None:
            raise TypeError(
                f"app '{self.name}': @app.procedure needs args={{name: Int() | Str() | List(...)}} (args={{}} for none)"
            )
        schema = self._schema(name, args)
        paths = (keys, reads, writes)

        def register(target: Any) -> Procedure:
            proc_name = name or getattr(target, "__name__", None)
            if not isinstance(proc_name, str) or not proc_name:
                raise TypeError(f"app '{self.name}': cannot name the procedure {target!r}; give name=")
            derived = None
            if any(p is not None for p in paths):
                where = f"app '{self.name}', procedure '{proc_name}'"
                if analyze is not None or reconnoiter is not None or home is not None:
                    raise TypeError(
                        f"{where}: give its keys either as argument paths (keys=, reads=, writes=) "
                        f"or as analyze=, not both (nor home=)"
                    )
                derived = derived_analyze(where, schema, *paths)
            parts = self._parts(proc_name, target, derived or analyze, operations, reconnoiter, home)
            if proc_name in self._procedures:
                raise ValueError(f"app '{self.name}': procedure '{proc_name}' declared twice")
            try:
                procedure = Procedure(
                    proc_name,
                    schema,
                    parts.get("analyze"),
                    parts["run"],
                    parts.get("operations"),
                    parts.get("reconnoiter"),
                    home=parts.get("home"),
                )
            except TypeError as exc:
                raise TypeError(f"app '{self.name}', {exc}") from None
            self._procedures[proc_name] = procedure
            if derived is not None:  # derived_analyze has checked the paths' shape
                self._path_tables[proc_name] = list(dict.fromkeys(table for given in paths for table, _ in given or ()))
            return procedure

        return register

    def _schema(self, name: str | None, args: Any) -> dict:
        where = f"app '{self.name}', procedure '{name}'" if name else f"app '{self.name}'"
        if not isinstance(args, dict):
            raise TypeError(
                f"{where}: args must be a dict of argument name to a field: Int(), Str(), Float(), "
                f"Bool(), Object(), Optional(...) or List(...)"
            )
        for arg, field in args.items():
            if not isinstance(arg, str) or not isinstance(field, FIELD_TYPES):
                raise TypeError(
                    f"{where}: args[{arg!r}] must be Int(), Str(), Float(), Bool(), Object(), "
                    f"Optional(...) or List(...), got {field!r}"
                )
        return dict(args)

    def _parts(self, proc_name: str, target: Any, analyze, operations, reconnoiter, home) -> dict[str, Callable]:
        where = f"app '{self.name}', procedure '{proc_name}'"
        if isinstance(target, type):
            given = {"analyze": analyze, "operations": operations, "reconnoiter": reconnoiter, "home": home}
            parts = {part: vars(target)[part] for part in PARTS if part in vars(target)}
            for part, value in given.items():
                if value is not None:
                    parts[part] = value
            parts = {
                part: (value.__func__ if isinstance(value, staticmethod) else value) for part, value in parts.items()
            }
            own = [n for n in vars(target) if not n.startswith("__")]
            for unknown in (n for n in own if n not in PARTS):
                close = difflib.get_close_matches(unknown, PARTS, n=1, cutoff=0.6)
                if close and close[0] not in vars(target):
                    raise TypeError(
                        f"{where}: '{unknown}' is not a part of a procedure; did you mean "
                        f"'{close[0]}'? (parts: {', '.join(PARTS)})"
                    )
            missing = [
                part for part in ("analyze", "run") if part not in parts and not (part == "analyze" and "home" in parts)
            ]
            if missing:
                raise TypeError(
                    f"{where}: the class needs {' and '.join(missing)} "
                    f"(def analyze(args) -> (reads, writes), or home = (table, argument) to have "
                    f"its keys found by running it; def run(ctx, args))"
                )
        elif callable(target):
            if analyze is None and home is None:
                raise TypeError(
                    f"{where}: a RUN function needs analyze= in the decorator, or home= to have "
                    f"its keys found by running it (or decorate a class with analyze and run)"
                )
            parts = {
                "run": target,
                "analyze": analyze,
                "operations": operations,
                "reconnoiter": reconnoiter,
                "home": home,
            }
        else:
            raise TypeError(f"{where}: @app.procedure decorates a class or a function, not {target!r}")
        for part, value in parts.items():
            if part != "home" and value is not None and not callable(value):
                raise TypeError(f"{where}: {part} must be a function, got {value!r}")
        return {part: value for part, value in parts.items() if value is not None}

    def __repr__(self) -> str:
        return f"App({self.name!r}: {len(self._tables)} tables, {len(self._procedures)} procedures)"


def derived_analyze(where: str, schema: dict, keys: list | None, reads: list | None, writes: list | None) -> Callable:
    """ANALYZE from keys given as argument paths: a pure function of the arguments by
    construction, so it gives the same sets on every call, as ANALYZE must."""

    def resolve(given: list | None, what: str) -> list[tuple[str, Any]]:
        if given is None:
            return []
        if not isinstance(given, (list, tuple)):
            raise TypeError(f"{where}: {what}= takes a list of (table, argument) pairs")
        resolved = []
        for item in given:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise TypeError(
                    f"{where}: {what}= holds {item!r}; each key is (table, argument name) or "
                    f"(table, (argument, …)) for a composite key"
                )
            table, path = item
            names = path if isinstance(path, tuple) else (path,)
            for arg in names:
                if arg not in schema:
                    raise TypeError(
                        f"{where}: {what}= names argument '{arg}', which is not in args{did_you_mean(str(arg), schema)}"
                    )
                if isinstance(schema[arg], List) and isinstance(path, tuple):
                    raise TypeError(f"{where}: {what}=: list argument '{arg}' cannot be part of a composite key")
                problem = key_field_problem(schema[arg])
                if problem is not None:
                    raise TypeError(f"{where}: {what}= names argument '{arg}': {problem}")
            resolved.append((table, path))
        return resolved

    both, read_only, write_only = resolve(keys, "keys"), resolve(reads, "reads"), resolve(writes, "writes")
    lists = {name for name, field in schema.items() if isinstance(field, List)}

    def expand(paths: list, args: dict) -> list:
        out = []
        for table, path in paths:
            if isinstance(path, tuple):
                out.append((table, tuple(args[name] for name in path)))
            elif path in lists:
                out.extend((table, item) for item in args[path])
            else:
                out.append((table, args[path]))
        return out

    def analyze(args: dict):
        shared = expand(both, args)
        return shared + expand(read_only, args), shared + expand(write_only, args)

    return analyze
