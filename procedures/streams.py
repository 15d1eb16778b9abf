"""S-Store's streaming model on top of the procedure contract (docs/streaming.md).

A workload module may declare, beside TABLES and PROCEDURES, a STREAMS list of:

    Stream(name, producers, consumers, on_insert)   a stream: which procedures emit to it
        (`ctx.emit(name, tuple)`), which are triggered by it (PE triggers), and an optional EE
        trigger `on_insert(ctx, tuple)` run inside the emitting transaction for every tuple.
        A stream with no producers is an input stream: a request names one of its consumers
        with `{"batch": [tuple, ...]}`, each tuple checked against that consumer's `args`.
        A stream with no consumers is an output stream.
    Window(name, owner, rows=, slide=)  or  Window(name, owner, range_ms=, slide_ms=)
        a sliding window owned by one procedure, kept in the engine table `window.<name>`,
        staged until it slides; `on_slide(ctx, rows)` runs inside the transaction when it does.
    Nested(name, procedures)  a nested transaction: procedures of one dataflow that commit
        or abort as one.

The dataflow fired by one request runs inside that request's slot in the total order, as
one transaction to every scheduler: the input procedure's RUN, then every procedure
triggered by a stream, in graph order, each with the atomic batch of tuples emitted to its
stream during this slot. Its read and write sets are the union of the ANALYZE of every
procedure reachable from the input procedure (each given the request's arguments), plus
the windows they own. Each triggered procedure is its own sub-transaction: its abort rolls
back its own writes and emits only, so its subtree does not fire (unless fed otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NoReturn

from ordo.procedures.args import ArgumentError, _kind, check_args
from ordo.procedures.contract import Abort, Key, Procedure, Table, UndeclaredAccess

WINDOW_TABLE_PREFIX = "window."
# An output stream (consumed by nobody) keeps, under key 0, the tuples the last transaction
# emitted to it; its change data carries every transaction's tuples, which the engine
# publishes one by one on <ns>.stream.<name> (scheduler/stream_outputs.py).
OUTPUT_TABLE_PREFIX = "stream."
# The engine's own tables, beside an app's: `ordo dump` leaves them out unless asked
# (`--internal`); the digest, checkpoints and replay treat them like any state.
INTERNAL_TABLE_PREFIXES = (OUTPUT_TABLE_PREFIX, WINDOW_TABLE_PREFIX)
MAX_BATCH = 1024


def is_internal_table(name: str) -> bool:
    """Whether `name` is one of the engine's tables of output streams and windows."""
    return name.startswith(INTERNAL_TABLE_PREFIXES)


@dataclass(frozen=True)
class Stream:
    name: str
    producers: tuple[str, ...] = ()
    consumers: tuple[str, ...] = ()
    on_insert: Callable[[Any, Any], None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "producers", tuple(self.producers))
        object.__setattr__(self, "consumers", tuple(self.consumers))


@dataclass(frozen=True)
class Window:
    """Tuple-based (`rows`, `slide`) or time-based (`range_ms`, `slide_ms`, by `ctx.now`)."""

    name: str
    owner: str
    rows: int | None = None
    slide: int | None = None
    range_ms: int | None = None
    slide_ms: int | None = None
    on_slide: Callable[[Any, list], None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        by_rows = self.rows is not None or self.slide is not None
        by_time = self.range_ms is not None or self.slide_ms is not None
        if by_rows == by_time:
            raise ValueError(f"window '{self.name}': give either rows and slide, or range_ms and slide_ms")
        size, step = (self.rows, self.slide) if by_rows else (self.range_ms, self.slide_ms)
        if type(size) is not int or type(step) is not int or not 1 <= step <= size:
            raise ValueError(f"window '{self.name}': need integers 1 <= slide <= size")

    @property
    def table(self) -> str:
        return WINDOW_TABLE_PREFIX + self.name

    @property
    def keys(self) -> tuple[Key, ...]:
        return tuple((self.table, part) for part in range(4))


@dataclass(frozen=True)
class Nested:
    name: str
    procedures: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "procedures", tuple(self.procedures))


@dataclass(frozen=True)
class BatchField:
    """The `batch` argument of a request to an input stream: a list of tuples, each
    checked against the consuming procedure's own argument schema."""

    schema: dict

    def check(self, name: str, value: Any) -> list:
        if type(value) is not list:
            raise ArgumentError(f"argument '{name}': expected list of tuples, got {_kind(value)}")
        if not 1 <= len(value) <= MAX_BATCH:
            raise ArgumentError(f"argument '{name}': expected 1..{MAX_BATCH} tuples, got {len(value)}")
        for i, item in enumerate(value):
            try:
                check_args(self.schema, item)
            except ArgumentError as exc:
                raise ArgumentError(f"{name}[{i}]: {exc}") from None
        return value


# --- window state, in four keys of the window's table, so that staging a tuple between
# slides costs the same however many tuples wait: key 0 {"rows": [...]}, key 1 the newest
# staged tuples (at most _CHUNK), key 2 the older staged tuples in sealed chunks (rewritten
# once per _CHUNK tuples), key 3 the mark: the next slide's time for a time-based window,
# the number of staged tuples for a tuple-based one. Time-based tuples are [time, tuple]. A
# state written by the two-key layout ("edge" in key 0, every staged tuple in key 1) reads
# the same. ---

_ROWS, _HEAD, _SEALED, _MARK = 0, 1, 2, 3
_CHUNK = 128


def window_rows(ctx, window: Window) -> list:
    rows = (ctx.read(window.table, _ROWS) or {"rows": []})["rows"]
    return [row for _, row in rows] if window.range_ms else rows


def _stage(ctx, table: str, staged: Any) -> int:
    """Append one tuple to the staged ones: the number now in the head."""
    head = ctx.read(table, _HEAD) or []
    head.append(staged)
    if len(head) >= _CHUNK:
        sealed = ctx.read(table, _SEALED) or []
        sealed.append(head)
        ctx.write(table, _SEALED, sealed)
        head = []
    ctx.write(table, _HEAD, head)
    return len(head)


def _take_staged(ctx, table: str) -> list:
    """Every staged tuple, oldest first, leaving none staged."""
    sealed = ctx.read(table, _SEALED) or []
    head = ctx.read(table, _HEAD) or []
    if sealed:
        ctx.write(table, _SEALED, [])
    if head:
        ctx.write(table, _HEAD, [])
    return [item for chunk in sealed for item in chunk] + head


def window_insert(ctx, window: Window, item: Any) -> bool:
    """Stage `item`; slide when the slide is full (rows) or its time has come (range):
    True when the window slid, after its on_slide trigger ran."""
    table = window.table
    slid = False
    if window.rows is not None:
        staged = ctx.read(table, _MARK)
        if staged is None:  # nothing staged yet, or the two-key layout: all in the head
            staged = len(ctx.read(table, _HEAD) or [])
        if staged + 1 >= window.slide:
            rows = (ctx.read(table, _ROWS) or {"rows": []})["rows"]
            ctx.write(table, _ROWS, {"rows": (rows + _take_staged(ctx, table) + [item])[-window.rows :]})
            ctx.write(table, _MARK, 0)
            slid = True
        else:
            _stage(ctx, table, item)
            ctx.write(table, _MARK, staged + 1)
    else:
        now = ctx.now
        edge = ctx.read(table, _MARK)
        if edge is None:
            edge = (ctx.read(table, _ROWS) or {}).get("edge")
            if edge is None:
                edge = now - now % window.slide_ms + window.slide_ms
                ctx.write(table, _MARK, edge)
        if now >= edge:  # the staged tuples (all older than the edge) enter the window
            edge = now - now % window.slide_ms
            rows = (ctx.read(table, _ROWS) or {"rows": []})["rows"] + _take_staged(ctx, table)
            ctx.write(table, _ROWS, {"rows": [row for row in rows if row[0] > edge - window.range_ms]})
            ctx.write(table, _MARK, edge + window.slide_ms)
            slid = True
        _stage(ctx, table, [now, item])
    if slid and window.on_slide is not None:
        window.on_slide(ctx, window_rows(ctx, window))
    return slid


class DataflowResult:
    """What a dataflow's RUN returns: the input procedure's result, and the status of each
    triggered procedure that fired, in graph order ({"proc", "status", "error"}). The
    outcome record carries `value` as its result and `steps` beside it."""

    __slots__ = ("value", "steps")

    def __init__(self, value: Any, steps: list[dict]):
        self.value = value
        self.steps = steps

    def __eq__(self, other: Any) -> bool:
        return type(other) is DataflowResult and (self.value, self.steps) == (other.value, other.steps)

    def __reduce__(self):
        return DataflowResult, (self.value, self.steps)


def split_result(result: Any) -> tuple[Any, list[dict] | None]:
    """(result for the outcome record, the steps of a dataflow or None)."""
    if type(result) is DataflowResult:
        return result.value, result.steps
    return result, None


class StreamContext:
    """What a procedure of a dataflow sees: the transaction's context plus emit and
    windows. Reads and writes go straight to the one transaction of the request."""

    __slots__ = ("_ctx", "_flow", "_current", "_emitted", "now")

    def __init__(self, ctx, flow: "Dataflow", emitted: dict[str, list]):
        self._ctx = ctx
        self._flow = flow
        self._current = flow.input.name
        self._emitted = emitted
        self.now = ctx.now

    @property
    def random(self):
        return self._ctx.random

    def read(self, table, key):
        return self._ctx.read(table, key)

    def write(self, table, key, value) -> None:
        self._ctx.write(table, key, value)

    def delete(self, table, key) -> None:
        self._ctx.delete(table, key)

    def scan(self, table, prefix):
        return self._ctx.scan(table, prefix)

    def abort(self, reason: str) -> NoReturn:
        raise Abort(str(reason))

    def emit(self, stream: str, item: Any) -> None:
        declared = self._flow.streams.get(stream)
        if declared is None or self._current not in declared.producers:
            raise UndeclaredAccess(
                f"{self._current} emitted to stream '{stream}', which does not name it as a producer"
            )
        if type(item) is tuple:
            item = list(item)
        self._emitted.setdefault(stream, []).append(item)
        if declared.on_insert is not None:
            declared.on_insert(self, item)

    def window(self, name: str) -> list:
        """The rows of a window of this dataflow (staged tuples excluded)."""
        return window_rows(self, self._flow.window(name))

    def window_insert(self, name: str, item: Any) -> bool:
        window = self._flow.window(name)
        if window.owner != self._current:
            raise UndeclaredAccess(f"{self._current} inserted into window '{name}', owned by {window.owner}")
        return window_insert(self, window, item)


class Dataflow:
    """The plan of one input procedure: the triggered procedures it reaches, in graph order."""

    def __init__(
        self,
        input_procedure: Procedure,
        steps: list[Procedure],
        streams: dict[str, Stream],
        windows: dict[str, Window],
        groups: dict[str, Nested],
        input_stream: Stream | None,
    ):
        self.input = input_procedure
        self.steps = steps
        self.streams = streams
        self.windows = windows
        self.groups = groups  # procedure name -> its nested transaction
        self.input_stream = input_stream
        self.window_keys = tuple(
            key
            for w in windows.values()
            if w.owner == input_procedure.name or any(w.owner == s.name for s in steps)
            for key in w.keys
        )
        self.inputs_of = {s.name: tuple(st.name for st in streams.values() if s.name in st.consumers) for s in steps}
        members = {input_procedure.name, *(s.name for s in steps)}
        self.outputs = tuple(
            st.name for st in streams.values() if not st.consumers and members.intersection(st.producers)
        )
        self.output_keys = tuple((OUTPUT_TABLE_PREFIX + name, 0) for name in self.outputs)

    def describe(self) -> str:
        """What this dataflow runs, by value (procedures/fingerprint.py): its input stream,
        its steps in order with their argument schemas, the streams, windows and nested
        transactions, triggers by their import paths."""
        from ordo.procedures.fingerprint import by_value

        return by_value(
            {
                "input_stream": self.input_stream,
                "steps": [(s.name, sorted(s.args.items())) for s in self.steps],
                "streams": sorted(self.streams.items()),
                "windows": sorted(self.windows.items()),
                "groups": sorted(self.groups.items()),
            }
        )

    def window(self, name: str) -> Window:
        try:
            return self.windows[name]
        except KeyError:
            raise UndeclaredAccess(f"no window '{name}' in this dataflow") from None

    def analyze(self, args: dict):
        reads: list[Key] = []
        writes: list[Key] = []
        for procedure in (self.input, *self.steps):
            r, w = procedure.analyze(args)
            reads.extend(r)
            writes.extend(w)
        reads.extend(self.window_keys)
        writes.extend(self.window_keys)
        writes.extend(self.output_keys)
        return reads, writes

    def run(self, ctx, args: dict) -> Any:
        emitted: dict[str, list] = {}
        sctx = StreamContext(ctx, self, emitted)
        if self.input_stream is not None:  # an atomic batch for an input stream
            emitted[self.input_stream.name] = args["batch"]
            result = self.input.run(sctx, args["batch"])
        else:
            result = self.input.run(sctx, args)  # its abort is the request's abort
        writes = ctx.writes
        steps: list[dict] = []
        group_mark: tuple | None = None  # (group, writes, emitted, steps so far) when the group began
        failed_groups: set[str] = set()
        for step in self.steps:
            group = self.groups.get(step.name)
            if group is not None and group.name in failed_groups:
                continue
            batch = [item for stream in self.inputs_of[step.name] for item in emitted.get(stream, ())]
            if not batch:
                continue
            if group is not None and (group_mark is None or group_mark[0] is not group):
                group_mark = (group, dict(writes), {k: list(v) for k, v in emitted.items()}, len(steps))
            saved_writes, saved_emitted = dict(writes), {k: list(v) for k, v in emitted.items()}
            sctx._current = step.name
            try:
                step.run(sctx, batch)
                steps.append({"proc": step.name, "status": "committed", "error": None})
            except Exception as exc:  # Abort, UndeclaredAccess, a bad value or a fault: this step only
                reason = _reason(step.name, exc)
                steps.append({"proc": step.name, "status": "aborted", "error": reason})
                if group is not None:
                    failed_groups.add(group.name)
                    saved_writes, saved_emitted = group_mark[1], group_mark[2]
                    for earlier in steps[group_mark[3] : -1]:
                        earlier.update(status="aborted", error=f"nested transaction '{group.name}': {reason}")
                writes.clear()
                writes.update(saved_writes)
                emitted.clear()
                emitted.update(saved_emitted)
        for name in self.outputs:
            if emitted.get(name):
                ctx.write(OUTPUT_TABLE_PREFIX + name, 0, emitted[name])
        return DataflowResult(result, steps)


def _reason(name: str, exc: Exception) -> str:
    if isinstance(exc, Abort):
        return exc.reason
    if isinstance(exc, UndeclaredAccess):
        return f"undeclared access: {exc}"
    return f"{name} raised {type(exc).__name__}: {exc}"[:1000]


def _order(names: list[str], edges: dict[str, list[str]]) -> list[str]:
    """Graph order (Kahn), ties broken by declaration order; ValueError on a cycle."""
    incoming = {n: 0 for n in names}
    for n in names:
        for m in edges.get(n, ()):
            if m in incoming:
                incoming[m] += 1
    ready = [n for n in names if incoming[n] == 0]
    order: list[str] = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for m in edges.get(n, ()):
            if m in incoming:
                incoming[m] -= 1
                if incoming[m] == 0:
                    ready.append(m)
        ready.sort(key=names.index)
    if len(order) != len(names):
        raise ValueError("the streams between procedures form a cycle")
    return order


def compose(procedures: dict[str, Procedure], declarations: Iterable[Any]) -> tuple[list[Table], dict[str, Procedure]]:
    """The window tables, and the procedures that take requests with their dataflows
    composed in: name -> the Procedure a request of that name runs."""
    streams = {d.name: d for d in declarations if isinstance(d, Stream)}
    windows = {d.name: d for d in declarations if isinstance(d, Window)}
    nested = [d for d in declarations if isinstance(d, Nested)]
    if not streams:
        return [], {}
    for stream in streams.values():
        for name in stream.producers + stream.consumers:
            if name not in procedures:
                raise ValueError(f"stream '{stream.name}' names unknown procedure '{name}'")
    for window in windows.values():
        if window.owner not in procedures:
            raise ValueError(f"window '{window.name}' is owned by unknown procedure '{window.owner}'")
    names = list(procedures)
    edges = {n: [c for s in streams.values() if n in s.producers for c in s.consumers] for n in names}
    order = _order(names, edges)
    groups = {p: g for g in nested for p in g.procedures}
    triggered = {c for s in streams.values() if s.producers for c in s.consumers}
    composed: dict[str, Procedure] = {}
    for name in names:
        if name in triggered:
            continue
        input_streams = [s for s in streams.values() if not s.producers and name in s.consumers]
        if not input_streams and not any(name in s.producers for s in streams.values()):
            continue  # an ordinary procedure: it neither consumes an input stream nor emits
        reach: set[str] = set()
        todo = list(edges[name])
        while todo:
            n = todo.pop()
            if n not in reach:
                reach.add(n)
                todo.extend(edges[n])
        steps = [procedures[n] for n in order if n in reach]
        for member in (procedures[name], *steps):
            if member.reconnoiter is not None:
                raise ValueError(f"{member.name} has a reconnaissance and cannot be part of a dataflow")
        _check_groups(name, [s.name for s in steps], nested)
        procedure = procedures[name]
        flow = Dataflow(procedure, steps, streams, windows, groups, input_streams[0] if input_streams else None)
        schema = {"batch": BatchField(procedure.args)} if input_streams else procedure.args
        composed[name] = Procedure(name, schema, flow.analyze, flow.run, dataflow=flow.describe())
    for name in triggered:
        feeding = [s for s in streams.values() if s.producers and name in s.consumers]
        composed.setdefault(name, Procedure(name, procedures[name].args, TriggeredOnly(name, feeding), _never))
    tables = [Table(w.table, default=None) for w in windows.values()]
    tables += [Table(OUTPUT_TABLE_PREFIX + s.name, default=None) for s in streams.values() if not s.consumers]
    return tables, composed


def _check_groups(input_name: str, steps: list[str], nested: list[Nested]) -> None:
    for group in nested:
        at = [i for i, s in enumerate(steps) if s in group.procedures]
        if at and (at[-1] - at[0] + 1 != len(at)):
            raise ValueError(
                f"nested transaction '{group.name}': its procedures must follow one another "
                f"in the graph order of {input_name}'s dataflow"
            )
        if input_name in group.procedures:
            raise ValueError(f"nested transaction '{group.name}' may not hold the input procedure {input_name}")


class TriggeredOnly:
    """The ANALYZE of a procedure that a stream triggers: it takes no requests of its own,
    and a request naming it is rejected before its arguments are judged, with the
    procedures that make it run."""

    def __init__(self, name: str, feeding: list[Stream]) -> None:
        how = "; ".join(f"stream '{s.name}' (emitted to by {', '.join(s.producers)})" for s in feeding)
        self.message = (
            f"procedure '{name}' takes no requests of its own: it runs when {how} "
            f"triggers it; send the request to the procedure that starts the dataflow"
        )

    def __call__(self, args):
        from ordo.procedures.registry import RequestError

        raise RequestError(self.message)


def _never(ctx, args):
    raise Abort("a triggered procedure takes no requests of its own")
