"""`ordo recover`: bring a data directory's shards up to the head of the log, then exit.

The engine is started as usual (so the shards are first restored or rebuilt if they need
it, see `recovery.restore`), then replays the log. The head is the log's end offset as
the broker states it when recovery starts: every worker must read up to it and apply
what it read. Only then does the idle wait begin: the replay ends once no new batch has
arrived for `idle` seconds, so if a sequencer is still appending, the replay follows it
and ends at the first pause that long. Starting workers (Ray's take seconds) and reading
up to the head never count as idle. A replay that makes no progress towards the head
for STALL_LIMIT seconds, or stops short of it, fails with one line.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ordo.log.versions import kept_code, logged_set
from ordo.procedures.environment import environment_changes
from ordo.procedures.fingerprint import ENVIRONMENT, changes, describe, describe_as, is_versioned, set_id, short
from ordo.procedures.fingerprint import identities as all_forms
from ordo.procedures.kept import materialize
from ordo.procedures.loading import KEPT_AT, load_registry
from ordo.scheduler.coordinator import Coordinator, EngineStats
from ordo.storage.layout import LAYOUT_FILE, layout_partitions, publishes

if TYPE_CHECKING:
    from ordo.procedures.fingerprint import VersionBoundary

# Seconds a replay may go without a new batch applied before reaching the head it
# measured: far longer than starting Ray workers on a loaded machine takes.
STALL_LIMIT = 120.0


class ReplayShort(RuntimeError):
    """The replay did not reach the head of the log that recovery measured at its start."""


@dataclass(slots=True)
class ReplayReport:
    action: str  # what happened to the shards first: resume, fresh, restore or rebuild
    from_batch: int  # last batch applied before the replay
    to_batch: int  # last batch applied after it
    txns: int
    restore_s: float  # opening, restoring or wiping the shards, starting the workers
    replay_s: float  # start of the replay .. last batch applied (connecting to Kafka included,
    #                  the final idle wait excluded)
    steady_txns: int = 0  # txns applied after the first batch was seen applied ..
    steady_s: float = 0.0  # .. and the time that took: the rate once started up

    @property
    def batches(self) -> int:
        return self.to_batch - self.from_batch

    @property
    def txns_per_s(self) -> float:
        return self.txns / self.replay_s if self.replay_s > 0 else 0.0

    @property
    def steady_txns_per_s(self) -> float:
        return self.steady_txns / self.steady_s if self.steady_s > 0 else self.txns_per_s

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.replay_s if self.replay_s > 0 else 0.0


class ReplayProgress:
    """Watches the replay after every poll: once every worker has read and applied the log
    up to `head`, ends it when the log has been quiet for `idle` seconds; fails it if no
    batch is applied for `stall_limit` seconds before that. Shows one status line
    (rewritten in place on a terminal)."""

    def __init__(
        self,
        coordinator: Coordinator,
        idle: float,
        checkpoint_at_end: bool,
        stream=sys.stderr,
        quiet: bool = False,
        every: float = 1.0,
        head: int = 0,
        stall_limit: float = STALL_LIMIT,
    ):
        self.coordinator = coordinator
        self.idle = idle
        self.head = head
        self.stall_limit = stall_limit
        self.reached_at: float | None = None  # when every worker had caught up with `head`
        self.checkpoint_at_end = checkpoint_at_end
        self.stream = stream
        self.quiet = quiet
        self.every = every
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.start_batch = coordinator.stats.last_batch
        self.started = time.monotonic()
        self.last_new = self.started
        self._seen = self.start_batch
        self._shown = 0.0
        self._shown_batch = -1
        self.done = False
        self.first_new: tuple[float, int] | None = None  # (time, applied txns) when a batch was first seen applied
        self.last_txns = 0

    def __call__(self, stats: EngineStats) -> None:
        now = time.monotonic()
        if stats.last_batch != self._seen:
            self._seen = stats.last_batch
            self.last_new = now
            self.last_txns = stats.applied_txns
            if self.first_new is None:
                self.first_new = (now, stats.applied_txns)
        if self.reached_at is None:
            if self._caught_up():
                self.reached_at = now
            elif now - self.last_new > self.stall_limit:
                raise ReplayShort(self.shortfall(f"no batch applied for {self.stall_limit:.0f} s"))
        elif now - max(self.last_new, self.reached_at) > self.idle:
            if self.checkpoint_at_end:
                self.coordinator.checkpoint()
            self.coordinator.stop()
            self.done = True
        if not self.quiet and (now - self._shown >= self.every or self.done) and self._shown_batch != self._seen:
            self._shown, self._shown_batch = now, self._seen
            self._show(stats, now)

    def _caught_up(self) -> bool:
        """Every worker has read the log up to the head and applied all it read."""
        statuses = self.coordinator.statuses
        return bool(statuses) and all(
            s["position"] >= self.head and s["ready"] == 0 and s["unapplied"] == 0 for s in statuses
        )

    def shortfall(self, why: str) -> str:
        statuses = self.coordinator.statuses
        at = f"log offset {self.coordinator.read_position()}" if statuses else "the start"
        return (
            f"replay stopped at batch {self.coordinator.stats.last_batch} ({at}), short of the log's head at "
            f"offset {self.head} when recovery started: {why}; the shards are consistent, run `ordo recover` "
            f"again"
        )

    def _show(self, stats: EngineStats, now: float) -> None:
        elapsed = self.last_new - self.started
        replayed = stats.last_batch - self.start_batch
        line = (
            f"replay: batch {stats.last_batch} | {replayed} batches ({per_second(replayed, elapsed)}) | "
            f"{stats.txns:,} txns ({per_second(stats.txns, elapsed)}) | log lag ~{self.coordinator.unapplied_lag()}"
        )
        if self.tty:
            print("\r" + line.ljust(100), end="", file=self.stream, flush=True)
        else:
            print(line, file=self.stream, flush=True)


def recover(
    bootstrap: str,
    namespace: str,
    data_dir: str,
    scheduler: str = "serial",
    partitions: int | None = None,
    mode: str = "auto",
    idle: float = 2.0,
    checkpoint_at_end: bool = False,
    quiet: bool = False,
    stream=sys.stderr,
    publish: bool | None = None,
    **engine_options,
) -> ReplayReport:
    """Restore or rebuild the shards if they need it, replay the log to its head, stop.
    `engine_options` go to the Coordinator (placement, checkpoint_every, keep_checkpoints);
    `publish` as for `recover_across_versions`."""
    engine_options["publish"] = engine_options["check_copies"] = _publishing(
        namespace, data_dir, publish, quiet, stream
    )
    report, boundary = _replay(
        bootstrap,
        namespace,
        data_dir,
        scheduler,
        partitions,
        mode,
        idle,
        checkpoint_at_end,
        quiet,
        stream,
        **engine_options,
    )
    if boundary is not None:
        raise boundary
    if not quiet:
        print(_summary(report), file=stream, flush=True)
    return report


def _replay(
    bootstrap: str,
    namespace: str,
    data_dir: str,
    scheduler: str,
    partitions: int | None,
    mode: str,
    idle: float,
    checkpoint_at_end: bool,
    quiet: bool,
    stream,
    **engine_options,
) -> tuple[ReplayReport, VersionBoundary | None]:
    """One stretch: (what it replayed, the VersionBoundary it stopped at, or None at the head)."""
    from ordo.procedures.fingerprint import VersionBoundary

    if partitions is None:
        partitions = layout_partitions(data_dir) if os.path.exists(os.path.join(data_dir, LAYOUT_FILE)) else 1
    started = time.monotonic()
    coordinator = Coordinator(bootstrap, namespace, data_dir, scheduler, partitions, restore=mode, **engine_options)
    restore_s = time.monotonic() - started
    plan = coordinator.recovery
    say = (lambda text: None) if quiet else (lambda text: print(text, file=stream, flush=True))
    for path in plan.cleaned:
        say(f"removed {path} (left behind by a crash)")
    head = log_head(coordinator)
    if scheduler == "aria":
        from ordo.scheduler.aria import LOG_ORDER_NOTE

        say(LOG_ORDER_NOTE)
    from ordo.scheduler.group import LocalGroup

    where = "in this process" if isinstance(coordinator.group, LocalGroup) else "as Ray actors"
    say(
        f"{plan.describe()}; replaying {namespace}.log from batch {coordinator.cursor.next_batch} to its end "
        f"at offset {head} ({partitions} partition worker(s) {where}), then until no batch arrives for {idle:g}s"
    )
    from_batch = coordinator.stats.last_batch
    progress = ReplayProgress(coordinator, idle, checkpoint_at_end, stream, quiet, head=head)
    boundary: VersionBoundary | None = None
    try:
        stats = coordinator.run(progress=progress)
    except VersionBoundary as exc:  # every batch before it is applied: the stretch ends here
        boundary, stats = exc, coordinator.stats
    if progress.tty and not quiet:
        print(file=stream)
    if boundary is None and progress.reached_at is None:
        raise ReplayShort(progress.shortfall("the replay ended before it"))
    replayed = stats.last_batch > from_batch
    report = ReplayReport(
        plan.action,
        from_batch,
        stats.last_batch,
        stats.txns,
        restore_s,
        progress.last_new - progress.started if replayed else 0.0,
    )
    if replayed and progress.first_new is not None:
        first_at, first_txns = progress.first_new
        report.steady_txns = progress.last_txns - first_txns
        report.steady_s = progress.last_new - first_at
    return report, boundary


def _summary(report: ReplayReport) -> str:
    return (
        f"recovered: {report.action} + replay of {report.batches} batches, {report.txns:,} txns in "
        f"{report.replay_s:.2f}s ({per_second(report.batches, report.replay_s, 'batches')}, "
        f"{per_second(report.txns, report.replay_s, 'txns')}; shards ready in {report.restore_s:.2f}s); "
        f"applied through batch {report.to_batch}"
    )


def _joined(first: ReplayReport, later: ReplayReport) -> ReplayReport:
    """Two stretches of one replay as one: from where the first began to where the later
    ended, their transactions and times added up."""
    return ReplayReport(
        first.action,
        first.from_batch,
        later.to_batch,
        first.txns + later.txns,
        first.restore_s + later.restore_s,
        first.replay_s + later.replay_s,
        first.steady_txns + later.steady_txns,
        first.steady_s + later.steady_s,
    )


def recover_across_versions(
    versions: list[tuple[str, ...]],
    bootstrap: str,
    namespace: str,
    data_dir: str,
    scheduler: str = "serial",
    partitions: int | None = None,
    mode: str = "auto",
    idle: float = 2.0,
    checkpoint_at_end: bool = False,
    quiet: bool = False,
    stream=sys.stderr,
    kept_code: bool = True,
    publish: bool | None = None,
    **engine_options,
) -> ReplayReport:
    """`recover` with the procedure sets in `versions` (the current one first, each a tuple of
    specs): each stretch of the log replays with the set it was sequenced with. A replay
    stops where the log moves to another set (scheduler/follower.py); it goes on with the
    version whose identity that is, given or (`kept_code`) kept by the log, and refuses in
    one line when none is. The report, and the summary line, count every stretch.
    `publish`: whether the replay's outputs go to the namespace's topics (None: only where
    `data_dir` is an engine's own, storage/layout.py)."""
    import shutil
    import tempfile

    publishing = _publishing(namespace, data_dir, publish, quiet, stream)
    engine_options = {**engine_options, "publish": publishing, "check_copies": publishing}

    # The code given comes first: the workers stop at each set they do not run, and this loop
    # picks its code, given or kept by the log.
    engine_options = {**engine_options, "kept_code": False}
    registries = [(specs, load_registry(specs)) for specs in versions]
    identities = {identity: specs for specs, registry in registries for identity in all_forms(registry)}
    newest = {set_id(describe(registry)): specs for specs, registry in registries}  # how messages name them
    folder = tempfile.mkdtemp(prefix="ordo-kept-code-")  # the code the log keeps, for this replay
    try:
        return _recover_stretches(
            versions[0], identities, newest, [registry for _, registry in registries], folder if kept_code else None,
            bootstrap, namespace, data_dir, scheduler, partitions, mode, idle, checkpoint_at_end, quiet, stream,
            engine_options,
        )  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _publishing(namespace: str, data_dir: str, publish: bool | None, quiet: bool, stream) -> bool:
    """Whether the replay publishes its outputs (None: where `data_dir` is an engine's own),
    said before it starts."""
    publishing = publishes(data_dir) if publish is None else publish
    if not quiet:
        print(outputs_line(namespace, data_dir, publishing, publish is None), file=stream, flush=True)
    return publishing


def outputs_line(namespace: str, data_dir: str, publishing: bool, by_default: bool) -> str:
    """Where the replay's outputs go, said before it starts."""
    if publishing:
        why = f"{data_dir} is an engine's own data directory" if by_default else "--publish"
        return (
            f"outputs: published to {namespace}'s topics ({why}), each checked to equal the copy already there "
            f"under its key"
        )
    why = f"{data_dir} is not an engine's own data directory" if by_default else "--no-publish"
    return f"outputs: none published ({why}); {namespace}'s topics are left as they are"


def _from_the_log(bootstrap: str, namespace: str, identity: int, folder: str, batch: int) -> tuple[str, ...] | None:
    """The specs of set `identity` as the log keeps its code, written under `folder`, once
    the code is checked to be that set; None if the log keeps none."""
    packed = kept_code(bootstrap, namespace, identity)
    if packed is None:
        return None
    specs = materialize(packed, folder)
    try:
        registry = load_registry(specs)
    except ValueError as exc:
        raise RuntimeError(
            f"the code {namespace}.log keeps for procedure set {short(identity)} does not load here ({exc}): "
            f"give that version's code with --app-version MODULE:APP"
        ) from None
    if identity not in all_forms(registry):
        differing = environment_differences(bootstrap, namespace, identity, [registry])
        if differing:
            raise RuntimeError(environment_refusal(namespace, identity, differing, batch))
        raise RuntimeError(
            f"the code {namespace}.log keeps for procedure set {short(identity)} is not that set here: give that "
            f"version's code with --app-version MODULE:APP"
        )
    return specs


def environment_differences(bootstrap: str, namespace: str, identity: int, registries: list) -> list[str]:
    """How this process's environment differs from the one set `identity` was described in,
    where one of `registries` is that set's code and only the environment differs; else []."""
    found = logged_set(bootstrap, namespace, identity)
    if found is None or not is_versioned(found[0]) or ENVIRONMENT not in found[0]:
        return []
    logged = found[0]
    for registry in registries:
        ours = describe_as(registry, logged)
        differing = environment_changes(logged[ENVIRONMENT], ours.get(ENVIRONMENT))
        if differing and len(changes(logged, ours)) == len(differing):
            return differing
    return []


def environment_refusal(namespace: str, identity: int, differing: list[str], batch: int) -> str:
    return (
        f"{namespace}.log ran procedure set {short(identity)} in another environment than this one "
        f"({'; '.join(differing)}), so the batches from {batch} on could compute other outcomes here and none "
        f"of them is replayed: every batch before {batch} is applied; install what the set ran with and run "
        f"`ordo recover` again (docs/operations.md, 'What the identity covers')"
    )


def _recover_stretches(
    specs, identities, newest, given, folder, bootstrap, namespace, data_dir, scheduler, partitions, mode, idle,
    checkpoint_at_end, quiet, stream, engine_options,
) -> ReplayReport:  # fmt: skip
    seen: set = set()
    total: ReplayReport | None = None
    while True:
        report, boundary = _replay(
            bootstrap,
            namespace,
            data_dir,
            scheduler,
            partitions,
            mode,
            idle,
            checkpoint_at_end,
            quiet,
            stream,
            procedure_modules=specs,
            **engine_options,
        )
        total = report if total is None else _joined(total, report)
        if boundary is None:
            if not quiet:
                print(_summary(total), file=stream, flush=True)
            return total
        found = identities.get(boundary.identity)
        at = (boundary.batch, boundary.identity)
        kept = ""
        differing = environment_differences(bootstrap, namespace, boundary.identity, given) if found is None else []
        if differing:
            raise RuntimeError(environment_refusal(namespace, boundary.identity, differing, boundary.batch))
        if found is None and folder is not None:
            found = _from_the_log(bootstrap, namespace, boundary.identity, folder, boundary.batch)
            if found is not None:
                identities[boundary.identity] = found
                kept = "the code the log keeps: "
        if found is None or at in seen:
            given = ", ".join(f"{','.join(v) or 'the built-in workloads'} ({short(i)})" for i, v in newest.items())
            version = f"v{boundary.version} " if boundary.version else ""
            unkept = ", and the log keeps no code of it" if folder is not None else ""
            raise RuntimeError(
                f"the batches from {at[0]} on were sequenced with procedure set {version}"
                f"({short(at[1])}), which none of the procedures given is ({given}){unkept}: every batch "
                f"before {at[0]} is applied; give that version's code with --app-version MODULE:APP "
                f"and run `ordo recover` again (docs/operations.md, 'Upgrading procedures')"
            ) from None
        seen.add(at)
        if not quiet:
            print(
                f"from batch {at[0]}: procedure set {short(at[1])} "
                f"({kept}{','.join(spec.partition(KEPT_AT)[0] for spec in found) or 'the built-in workloads'})",
                file=stream,
                flush=True,
            )
        specs, mode = found, "auto"  # on from the shards as the boundary left them


MIN_TIMED_S = 0.1  # below this, a rate says more about the clock than about the replay


def per_second(count: int, seconds: float, unit: str = "") -> str:
    """'1,234 txns/s', or 'too fast to time' when `seconds` is too short to divide by (all
    of it was applied by the first look)."""
    if count and seconds < MIN_TIMED_S:
        return "too fast to time"
    rate = count / seconds if seconds > 0 else 0.0
    return f"{rate:,.0f} {unit}/s" if unit else f"{rate:,.0f}/s"


def log_head(coordinator: Coordinator, timeout: float = 30.0) -> int:
    """The log's end offset now: where the replay must get to."""
    try:
        return coordinator.log_end(timeout)
    except Exception as exc:
        coordinator.close()
        raise ReplayShort(
            f"the broker did not say where {coordinator.topics.log} ends within {timeout:.0f} s "
            f"({exc}); recovery needs it to know the replay is complete: check the broker, then "
            f"run `ordo recover` again"
        ) from None
