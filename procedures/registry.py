"""The registry of procedures and tables. Requests are checked against it twice: by the
sequencer (so bad requests are rejected in the log) and by the executor (defence in depth)."""

from __future__ import annotations

import difflib
from typing import Any, Iterable

from ordo.procedures.args import ArgumentError, check_args
from ordo.procedures.contract import ARIA, Key, Procedure, Table, home_key
from ordo.procedures.ollp import AssumptionError, assumed_values, found_sets, reconnaissance_keys, split_args
from ordo.procedures.streams import TriggeredOnly
from ordo.storage.keys import KeyRange, key_problem, normal_key


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest candidate, or '' if none is close."""
    close = difflib.get_close_matches(word, sorted(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


class RequestError(ValueError):
    """A request that cannot run: unknown procedure, bad arguments, failed ANALYZE."""


class UnusableKey(RequestError):
    """A request whose keys name no table or cannot be keys (storage/keys.py `key_problem`).
    A pure function of the request, so an engine that meets such an entry in the log
    (a log sequenced before keys were checked) rejects it as the sequencer now would."""


class Registry:
    def __init__(self) -> None:
        self.procedures: dict[str, Procedure] = {}
        self.tables: dict[str, Table] = {}
        self.range_tables: dict[str, tuple[int, int]] = {}  # table -> (range_by, partition_by)
        # procedure -> the modules whose source is its code (procedures/fingerprint.py)
        self.code: dict[str, tuple[str, ...]] = {}
        # procedure -> the functions its code is found from, and the modules named in code=
        # (procedures/reach.py)
        self.roots: dict[str, tuple[Any, ...]] = {}
        self.named_code: dict[str, tuple[str, ...]] = {}
        # source topic -> its Source (sequencer/sources.py), and the modules of its mapping's code
        self.sources: dict[str, Any] = {}
        self.source_code: dict[str, tuple[str, ...]] = {}
        self.source_named_code: dict[str, tuple[str, ...]] = {}

    def add_table(self, table: Table) -> None:
        existing = self.tables.get(table.name)
        if existing is not None and existing != table:
            raise ValueError(f"table '{table.name}' registered twice with different settings")
        self.tables[table.name] = table
        if table.range_by is not None:
            self.range_tables[table.name] = (table.range_by, table.partition_by)

    def add_procedure(self, procedure: Procedure) -> None:
        if procedure.name in self.procedures:
            raise ValueError(f"procedure '{procedure.name}' registered twice")
        self.procedures[procedure.name] = procedure
        if procedure.name not in self.code:
            from ordo.procedures.fingerprint import modules_of

            self.code[procedure.name] = tuple(sorted(modules_of(callables_of(procedure))))
        if procedure.name not in self.roots:
            self.roots[procedure.name] = tuple(callables_of(procedure))

    def add_workload(
        self,
        tables: Iterable[Table],
        procedures: Iterable[Procedure],
        streams: Iterable = (),
        code: Iterable[Any] = (),
        sources: Iterable = (),
    ) -> None:
        """`streams`: the module's STREAMS (procedures/streams.py); a procedure that starts a
        dataflow is registered with the dataflow composed in, so every scheduler runs it
        as one transaction. `sources`: its SOURCES (sequencer/sources.py). Every procedure
        and source of a workload has the same code: the modules of everything it declares,
        and `code` (modules, or their names) beside them."""
        from ordo.procedures.fingerprint import modules_of

        procedures = list(procedures)
        streams = list(streams)
        sources = list(sources)
        modules = modules_of(c for item in [*procedures, *streams, *sources] for c in callables_of(item))
        # the modules named beside those the declarations are in (found from the functions)
        named = tuple(sorted({m if isinstance(m, str) else m.__name__ for m in code} - modules))
        modules.update(named)
        for procedure in procedures:
            self.code[procedure.name] = tuple(sorted(modules))
            self.roots[procedure.name] = tuple(callables_of(procedure))
            self.named_code[procedure.name] = named
        for table in tables:
            self.add_table(table)
        for procedure in procedures:
            self.add_procedure(procedure)
        if streams:
            from ordo.procedures.streams import compose

            window_tables, composed = compose({p.name: p for p in procedures}, streams)
            for table in window_tables:
                self.add_table(table)
            self.procedures.update(composed)
            self.code.update((name, tuple(sorted(modules))) for name in composed)
            # a dataflow runs triggered procedures, triggers and slides: all of the workload's
            every = tuple(c for item in [*procedures, *streams] for c in callables_of(item))
            self.roots.update((name, every) for name in composed)
        for source in sources:
            self.add_source(source, modules)
            self.source_named_code[source.topic] = named

    def add_source(self, source: Any, modules: Iterable[str] = ()) -> None:
        """Records of `source.topic` become requests of `source.proc`, which must be registered."""
        if source.topic in self.sources:
            raise ValueError(f"topic '{source.topic}' declared as a source twice")
        if source.proc not in self.procedures:
            raise ValueError(
                f"source '{source.topic}' names procedure '{source.proc}', which is not declared"
                f"{did_you_mean(source.proc, self.procedures)}"
            )
        self.sources[source.topic] = source
        self.source_code[source.topic] = tuple(sorted(modules))

    def procedure(self, name: Any) -> Procedure:
        if type(name) is not str:
            raise RequestError("'proc' must be a string")
        try:
            return self.procedures[name]
        except KeyError:
            raise RequestError(f"unknown procedure '{name}'{did_you_mean(name, self.procedures)}") from None

    def analyze(
        self, name: Any, args: Any, ordering: str | None = None
    ) -> tuple[Procedure, tuple[Key, ...], tuple[Key, ...]]:
        """Validate a request and return its procedure with its read and write sets.

        Sets keep first-seen order and drop repeats, so the same arguments always give
        the same sets. A procedure without analyze has the sets its runs found (its
        record, procedures/ollp.py), or before its first run its home key as its read set,
        which places it; in a batch ordered by aria (`ordering`, log/records.py) always
        the home key: aria finds its keys by running it within the batch.
        """
        procedure = self.procedure(name)
        if isinstance(procedure.analyze, TriggeredOnly):
            procedure.analyze(args)  # rejects the request, whatever its arguments
        if procedure.analyze is None:
            reads, writes = self._without_analyze(procedure, args, ordering)
        elif procedure.reconnoiter is not None:
            reads, writes = self._analyze_dependent(procedure, args)
        else:
            try:
                check_args(procedure.args, args)
            except ArgumentError as exc:
                raise RequestError(f"{procedure.name}: {exc}") from None
            try:
                reads, writes = procedure.analyze(args)
                reads, writes = _ordered_set(reads), _ordered_set(writes)
            except Exception as exc:  # a procedure's ANALYZE is user code
                raise RequestError(f"{procedure.name}: ANALYZE failed: {type(exc).__name__}: {exc}") from None
        tables, range_tables = self.tables, self.range_tables
        ranged = False
        for table, key in reads + writes:
            if type(table) is not str or table not in tables:
                raise UnusableKey(f"{procedure.name}: ANALYZE named unknown table {_quoted(table)}")
            problem = key_problem(key)
            if problem is not None:
                raise UnusableKey(f"{procedure.name}: key of table '{table}': {problem}")
            if table in range_tables or type(key) is KeyRange:
                ranged = True
        if ranged:
            reads, writes = self._with_ranges(procedure.name, reads, writes)
        return procedure, reads, writes

    def _with_ranges(self, name: str, reads: tuple, writes: tuple) -> tuple[tuple, tuple]:
        """Check declared ranges, and add to the write set the range of every key of a
        range table the transaction touches, so it is locked against anyone who declared
        that range (docs/keys.md)."""
        ranges = self.range_tables
        implied: list[Key] = []
        read_ranges: list[Key] = []
        for which, keys in (("read", reads), ("write", writes)):
            for table, key in keys:
                shape = ranges.get(table)
                if type(key) is KeyRange:
                    if shape is None or len(key.components) != shape[0]:
                        need = "no ranges" if shape is None else f"ranges of {shape[0]} components"
                        raise RequestError(
                            f"{name}: {which} range {table}{list(key.components)}: table '{table}' takes {need}"
                        )
                    if which == "read":
                        read_ranges.append((table, key))
                elif shape is not None:
                    if type(key) is not tuple or len(key) < shape[0]:
                        raise RequestError(
                            f"{name}: key {key!r} of table '{table}' needs at least {shape[0]} components"
                        )
                    implied.append((table, KeyRange(key[: shape[0]])))
        if read_ranges:
            self._check_confined(name, read_ranges, reads + writes)
        if not implied:
            return reads, writes
        return reads, _ordered_set(writes + tuple(implied))

    def _check_confined(self, name: str, read_ranges: list, keys: tuple) -> None:
        """A transaction that reads a range runs where that range lies, under any partition
        count: all its keys must share the range's partition component."""
        table, rng = read_ranges[0]
        home = rng.components[self.range_tables[table][1]]
        for table, key in keys:
            spec = self.tables[table].partitioner
            components = key.components if type(key) is KeyRange else key
            if not spec.startswith("component:"):
                raise RequestError(
                    f"{name}: a transaction that reads a range may only touch tables partitioned "
                    f"like it; '{table}' is not"
                )
            index = int(spec[len("component:") :])
            if type(components) is not tuple or index >= len(components) or components[index] != home:
                raise RequestError(
                    f"{name}: a transaction that reads a range must keep to its partition "
                    f"(component {home!r}); {table}{key!r} does not"
                )

    @staticmethod
    def _without_analyze(procedure: Procedure, args: Any, ordering: str | None) -> tuple[tuple, tuple]:
        plain, record = split_args(args)
        try:
            check_args(procedure.args, plain)
        except ArgumentError as exc:
            raise RequestError(f"{procedure.name}: {exc}") from None
        if plain is not args:
            args.update(plain)  # in their logged form, as check_args leaves them
        if record is not None and ordering != ARIA:
            try:
                return found_sets(record)
            except AssumptionError as exc:
                raise RequestError(f"{procedure.name}: {exc}") from None
        try:
            table, key = home_key(procedure, plain)
            return ((table, normal_key(key)),), ()
        except Exception as exc:
            raise RequestError(f"{procedure.name}: its home key failed: {type(exc).__name__}: {exc}") from None

    @staticmethod
    def _analyze_dependent(procedure: Procedure, args: Any) -> tuple[tuple[Key, ...], tuple[Key, ...]]:
        """ANALYZE of a procedure with a reconnaissance (procedures/ollp.py): without assumed
        values, its read set is the reconnaissance keys; with them, the sets they give."""
        plain, record = split_args(args)
        try:
            check_args(procedure.args, plain)
        except ArgumentError as exc:
            raise RequestError(f"{procedure.name}: {exc}") from None
        if plain is not args:
            args.update(plain)  # in their logged form, as check_args leaves them
        try:
            keys = reconnaissance_keys(procedure, plain)
            if record is None:
                return _ordered_set(keys), ()
            assumed = assumed_values(record, keys)
        except AssumptionError as exc:
            raise RequestError(f"{procedure.name}: {exc}") from None
        except Exception as exc:
            raise RequestError(f"{procedure.name}: reconnaissance failed: {type(exc).__name__}: {exc}") from None
        try:
            reads, writes = procedure.analyze(plain, assumed)
            return _ordered_set(keys + tuple(reads)), _ordered_set(writes)
        except Exception as exc:
            raise RequestError(f"{procedure.name}: ANALYZE failed: {type(exc).__name__}: {exc}") from None


def _quoted(table: Any) -> str:
    return f"'{table}'" if type(table) is str else f"{table!r} (a table is named by a string)"


def callables_of(item: Any) -> list:
    """The functions a procedure or a streaming declaration is made of."""
    import dataclasses

    if not dataclasses.is_dataclass(item):
        return []
    return [value for value in (getattr(item, f.name) for f in dataclasses.fields(item)) if callable(value)]


def _ordered_set(keys: Iterable[Key]) -> tuple[Key, ...]:
    if type(keys) is not list and type(keys) is not tuple:
        keys = list(keys)  # a generator is read once, whichever path below takes it
    try:
        ordered = tuple(dict.fromkeys(keys))
    except TypeError:  # pairs or composite keys given as lists rather than tuples
        ordered = tuple(dict.fromkeys((table, normal_key(key)) for table, key in keys))
    for item in ordered:
        if type(item) is not tuple or len(item) != 2:
            raise TypeError(f"a key must be a (table, key) pair, got {item!r}")
    return ordered


def default_registry(extra_modules: Iterable[str] = ()) -> Registry:
    """Every built-in workload, plus the procedures of `extra_modules`: import paths of
    modules that define TABLES and PROCEDURES, as the built-in workload modules do."""
    import importlib

    from ordo.procedures.workloads import ALL_WORKLOADS

    registry = Registry()
    for workload in ALL_WORKLOADS.values():
        registry.add_workload(workload.TABLES, workload.PROCEDURES, getattr(workload, "STREAMS", ()))
    for name in extra_modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ValueError(f"cannot import procedures module '{name}': {exc}") from None
        registry.add_workload(
            getattr(module, "TABLES", ()), getattr(module, "PROCEDURES", ()), getattr(module, "STREAMS", ())
        )
    return registry
