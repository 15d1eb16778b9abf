"""Wiring: the long-running services behind `ordo run`, `ordo sequence` and `ordo execute`."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import Callable

from ordo import stopping
from ordo.procedures.loading import load_registry
from ordo.procedures.registry import Registry
from ordo.scheduler.coordinator import Coordinator
from ordo.scheduler.liveness import SILENT_AFTER, Silence
from ordo.storage.layout import check_layout
from ordo.broker.lag import sequencer_group
from ordo.sequencer.lane_owner import EXIT_ANOTHER_ENGINE, OWNER_ENV, own_owner, owner_env, refuse_if_taken
from ordo.broker.reachability import BrokerWatch
from ordo.sequencer.sequencer import RECORD_FRAMING, Handover, Sequencer, SequencerConfig
from ordo.sequencer.sources import check_sources
from ordo.broker.topics import Topics, ensure_topics, request_partitions_for
from ordo.log.versions import EXIT_UPGRADED, Current, UpgradedAway, check_set, current_set, upgrade_command


def on_checkpoint_signal(coordinator: Coordinator) -> None:
    """SIGUSR1 asks a running engine for a checkpoint at the next batch boundary."""
    signal.signal(signal.SIGUSR1, lambda signum, frame: coordinator.request_checkpoint())


def announce_start(coordinator: Coordinator, stream=sys.stderr) -> None:
    """What recovery did before the engine started, and where Ray workers run (their pids
    are what an operator, or a crash test, kills)."""
    plan = coordinator.recovery
    for path in plan.cleaned:
        print(f"removed {path} (left behind by a crash)", file=stream, flush=True)
    if plan.action in ("restore", "rebuild"):
        print(
            f"{plan.describe()}; replaying the log from batch {coordinator.cursor.next_batch}", file=stream, flush=True
        )
    where = getattr(coordinator.group, "where", None)
    if where is not None:
        for worker in where():
            print(
                f"partition {worker['partition']}: pid {worker['pid']}, cores {worker['cores']}",
                file=stream,
                flush=True,
            )


def serve_sequencer(
    bootstrap: str,
    namespace: str,
    config: SequencerConfig,
    procedure_modules: tuple[str, ...] = (),
    quiet: bool = False,
) -> int:
    """Sequence until stopped. When `ordo upgrade` moves the log to the set the app's files
    on disk now define, go on with it in this process (a new generation of the lane, as a
    restart would start); otherwise stop (UpgradedAway)."""
    registry = load_registry(procedure_modules)
    stopped = threading.Event()
    current: list[Sequencer] = []

    def stop() -> None:
        stopped.set()
        if current:
            current[0].stop()

    stopping.on_stop(stop)
    checked: Current | None = None
    handover: Handover | None = None
    while not stopped.is_set():
        sequencer = Sequencer(bootstrap, namespace, registry, config, procedure_specs=procedure_modules)
        current[:] = [sequencer]
        try:
            sequencer.start(checked=checked, handover=handover)
            if stopped.is_set():
                sequencer.stop()
            say_when_settled(sequencer.settled)
            if not quiet and config.sequencers == 1:
                print(
                    f"sequencer generation {sequencer.generation} resumes at batch {sequencer.next_batch}",
                    file=sys.stderr,
                    flush=True,
                )
            elif not quiet:
                print(
                    f"sequencer {config.index} of {config.sequencers} resumes at its batch {sequencer.next_epoch}",
                    file=sys.stderr,
                    flush=True,
                )
            sequencer.run()
            return 0
        except UpgradedAway as away:
            handover = sequencer.handed_over
            sequencer.close()
            following, now = upgraded_in_place(bootstrap, namespace, procedure_modules, registry)
            if following is None:
                if now is not None:
                    away.version = max(away.version or 0, now.version)
                raise
            registry, checked = following, now
    return 0


def upgraded_in_place(
    bootstrap: str, namespace: str, specs: tuple[str, ...], registry: Registry
) -> tuple[Registry | None, Current | None]:
    """The set the log moved to, when the app's files on disk define it now (else None),
    and the log's set as read."""
    from ordo.procedures.fingerprint import short
    from ordo.procedures.reload import registry_for

    now = current_set(bootstrap, Topics(namespace).log, 30)
    if now is None:
        return None, None
    from ordo.log.versions import kept_code

    kept = lambda: kept_code(bootstrap, namespace, now.identity, 30, at=now.offset)  # noqa: E731
    following, how = registry_for(now.identity, specs, registry, kept)
    if following is None or not now.matches(following):
        return None, now
    print(
        f"sequencer: {Topics(namespace).log} moved to procedure set v{now.version} ({short(now.identity)}), "
        f"the app's code {how}: going on with it",
        file=sys.stderr,
        flush=True,
    )
    return following, now


def serve_engine(
    bootstrap: str,
    namespace: str,
    data_dir: str,
    scheduler: str,
    partitions: int,
    quiet: bool = False,
    placement: dict | None = None,
    checkpointing: dict | None = None,
    metrics_port: int | None = None,
) -> int:
    from ordo.metrics import engine_observer

    coordinator = Coordinator(
        bootstrap, namespace, data_dir, scheduler, partitions, **(placement or {}), **(checkpointing or {})
    )
    stopping.on_stop(coordinator.stop)
    on_checkpoint_signal(coordinator)
    announce_start(coordinator)
    print(
        f"engine ({scheduler}, {partitions} partition(s)) resumes after batch {coordinator.stats.last_batch}",
        file=sys.stderr,
        flush=True,
    )
    say_log_order(scheduler)
    sources = tuple(load_registry(placement.get("procedure_modules", ())).sources) if placement else ()
    progress, close_observer = engine_observer(coordinator, bootstrap, namespace, quiet, metrics_port, sources=sources)
    broker = BrokerWatch(bootstrap).start()
    try:
        coordinator.run(progress=progress)
    finally:
        broker.stop()
        close_observer()
    return 0


def say_log_order(scheduler: str) -> None:
    if scheduler == "aria":
        from ordo.scheduler.aria import LOG_ORDER_NOTE

        print(LOG_ORDER_NOTE, file=sys.stderr, flush=True)


# Set by a parent for the child it starts: the parent's pid, which the child then dies with.
PARENT_ENV = "ORDO_DIE_WITH_PARENT"
# Set by a parent for the child it starts: a pipe the child writes a byte to every
# HEARTBEAT_EVERY seconds while its process runs.
HEARTBEAT_ENV = "ORDO_HEARTBEAT_FD"
HEARTBEAT_EVERY = 1.0
# A sequencer process silent this long is killed (SIGKILL) and started again: a stopped
# or frozen process holds its request partitions, and requests would wait for ever.
SEQUENCER_SILENT_LIMIT = 30.0
# How often a sequencer that left for a procedure set its app on disk is not looks at whether
# the engine went on with that set (`SequencerProcess._after_upgrade`).
UPGRADE_LOOK_EVERY = 1.0
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child started with PARENT_ENV: have the kernel SIGKILL this process when its
    parent dies, however the parent dies (SIGKILL included, when no handler can run).

    Why prctl(PR_SET_PDEATHSIG) rather than polling os.getppid(): the kernel delivers it
    at once, and it needs no thread of ours that must stay alive and scheduled in the child.
    Why the child sets it, after exec, rather than a preexec_fn: preexec_fn runs Python in
    the forked copy of a process full of threads (Ray, librdkafka, the supervisor), which
    Python documents as unsafe. Comparing getppid() with the pid the parent passed closes
    the window in which the parent died before this call. SIGKILL, not SIGTERM: the
    sequencer is built to be killed at any point (exactly-once append, tested under
    repeated SIGKILL), and a signal that cannot be caught or delayed leaves no orphan.
    Linux only; elsewhere a child outlives a killed parent as before."""
    parent = os.environ.pop(PARENT_ENV, None)  # not for the child's own children
    if parent is None or not sys.platform.startswith("linux"):
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    if prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0) != 0:
        return
    if os.getppid() != int(parent):
        os._exit(1)  # the parent is already gone


_beats_fd: int | None = None  # the heartbeat pipe's write end, in a child that has one
SETTLED_BEAT = b"S"  # on the heartbeat pipe: this sequencer's lane is its own (Sequencer.settled)
# On the heartbeat pipe, around a version number: the version of the log's procedure set this
# sequencer leaves for, its app on disk being another set (UpgradedAway).
LEFT_FOR_BEAT, LEFT_FOR_END = b"U", b";"


def send_heartbeats() -> None:
    """In a child started with HEARTBEAT_ENV: beat from a thread of its own for as long as
    the process runs; a process stopped (SIGSTOP) or frozen stops beating."""
    global _beats_fd
    fd = os.environ.pop(HEARTBEAT_ENV, None)
    if fd is None:
        return
    _beats_fd = int(fd)

    def beat() -> None:
        try:
            while True:
                os.write(int(fd), b".")
                time.sleep(HEARTBEAT_EVERY)
        except OSError:
            pass  # the parent is gone

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()


def say_when_settled(settled: threading.Event) -> None:
    """Tell the engine that started this sequencer, once, when its lane is settled."""
    if _beats_fd is None:
        return

    def wait() -> None:
        settled.wait()
        try:
            os.write(_beats_fd, SETTLED_BEAT)
        except OSError:
            pass  # the parent is gone

    threading.Thread(target=wait, name="settled", daemon=True).start()


def say_left_for(version: int | None) -> None:
    """Tell the engine that started this sequencer which version of the log's set it
    leaves for, as it exits with EXIT_UPGRADED."""
    if _beats_fd is None or version is None:
        return
    try:
        os.write(_beats_fd, LEFT_FOR_BEAT + str(version).encode() + LEFT_FOR_END)
    except OSError:
        pass  # the parent is gone


def left_for(beats: bytes) -> int | None:
    """The version a LEFT_FOR_BEAT among `beats` names, if one does."""
    start = beats.rfind(LEFT_FOR_BEAT)
    end = beats.find(LEFT_FOR_END, start)
    if start < 0 or end < 0:
        return None
    try:
        return int(beats[start + 1 : end])
    except ValueError:
        return None


def sequencer_command(
    bootstrap: str,
    namespace: str,
    config: SequencerConfig,
    procedure_modules: tuple[str, ...] = (),
    quiet: bool = False,
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "ordo.cli",
        "sequence",
        "--bootstrap-servers",
        bootstrap,
        "--namespace",
        namespace,
        *(["--max-delay-ms", str(config.max_delay_ms)] if config.max_delay_ms is not None else []),
        *(["--min-delay-ms", str(config.min_delay_ms)] if config.min_delay_ms is not None else []),
        "--max-txns",
        str(config.max_txns),
        "--max-bytes",
        str(config.max_bytes),
        "--max-request-bytes",
        str(config.max_request_bytes),
        "--dedupe-window",
        str(config.dedupe_window),
        "--partitions",
        str(config.partitions),
        "--sequencers",
        str(config.sequencers),
        "--sequencer-index",
        str(config.index),
        "--ordering",
        config.ordering or "log",
        *(arg for module in procedure_modules for arg in ("--procedures", module)),
        "--log-level",
        _log_level(),
        *(["--quiet"] if quiet else []),
    ]


def _log_level() -> str:
    """This process's --log-level, for the child it starts."""
    import logging

    name = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    return name if name in ("debug", "info", "warning", "error") else "warning"


# A sequencer that exits with an error this soon after it started, this many times in a
# row, fails at start-up (a procedure module it cannot import, a setting it refuses):
# starting it again would only repeat the failure, so the engine stops with its reason.
# An exit while the broker was away is the broker's, not the sequencer's: it never counts.
FAST_FAILURE_S = 15.0
FAST_FAILURES = 3
SEQUENCE_ERROR = "ordo sequence: "  # how the sequencer's closing error line begins (ordo/cli.py)
# A sequencer has this long to take its engine's SIGTERM, then it is killed as in a crash,
# which it is made for: the next generation resumes from the log. One whose broker is gone
# waits in its consumer's close for half a minute and more.
SEQUENCER_STOP_GRACE_S = 3.0


class SequencerProcess:
    """A sequencer in a child process of its own (its own core, its own GIL), restarted
    if it dies: a restart takes the lane over and resumes from the log. One that keeps
    failing at start-up is given up: `failure` says why and `on_failure` is called. One
    that stops beating (SIGSTOP, a hang) is named, then killed and restarted. One that
    exits while the broker is away is started again once `broker` sees it answer. One that
    left because the log moved to a procedure set its app on disk is not waits for the
    engine (`engine`: its workers' statuses) to stop at that set's first batch, and is
    started again once the engine runs the set the log runs (`_after_upgrade`)."""

    def __init__(
        self,
        bootstrap: str,
        namespace: str,
        config: SequencerConfig,
        procedure_modules: tuple[str, ...] = (),
        quiet: bool = False,
        on_failure: Callable[[], None] | None = None,
        broker: BrokerWatch | None = None,
        engine: Callable[[], list[dict]] | None = None,
    ):
        self._command = sequencer_command(bootstrap, namespace, config, procedure_modules, quiet)
        self._bootstrap = bootstrap
        self._log = Topics(namespace).log
        self._engine = engine
        self._name = "sequencer" if config.sequencers == 1 else f"sequencer {config.index}"
        self._process: subprocess.Popen | None = None
        self._beats: int | None = None  # the read end of the running child's heartbeat pipe
        self._last_beat = 0.0
        self._stopping = threading.Event()
        self._watch = threading.Thread(target=self._supervise, daemon=True)
        self._on_failure = on_failure
        self._broker = broker
        self._relaying: threading.Thread | None = None
        self._last_line = ""  # the child's last line on standard error: its reason, when it fails
        self._held_line = ""  # its closing error line, passed on once its exit status is known
        self.settled = threading.Event()  # a child of it has said its lane is settled
        self._left_for: int | None = None  # the version of the log's set the child left for (say_left_for)
        self.restarts = 0
        self.failure: str | None = None

    def _spawn(self) -> subprocess.Popen:
        # The child dies with this process (die_with_parent). The kernel ties that to the
        # thread that forks it: the main thread here, the supervisor for a restart; both
        # live as long as the engine serves.
        # A process group of its own: a Ctrl-C at the terminal reaches the engine only, which
        # stops the sequencer itself (`stop`), rather than the sequencer exiting first and
        # being taken for a crash.
        beats, beat = os.pipe()
        try:
            process = subprocess.Popen(
                self._command,
                stderr=subprocess.PIPE,
                process_group=0,
                pass_fds=(beat,),
                env={**os.environ, "PYTHONUNBUFFERED": "1", PARENT_ENV: str(os.getpid()), HEARTBEAT_ENV: str(beat)},
            )
        except BaseException:
            os.close(beats)
            raise
        finally:
            os.close(beat)
        if self._beats is not None:
            os.close(self._beats)
        self._beats, self._last_beat = beats, time.monotonic()
        self._relaying = threading.Thread(target=self._relay, args=(process.stderr,), daemon=True)
        self._relaying.start()
        return process

    def _relay(self, stream) -> None:
        """Pass the child's standard error on, keeping its last line. Its closing error line
        waits for the exit status: when the engine stops for it, the engine's own line says it."""
        for raw in stream:
            line = raw.decode("utf-8", "replace")
            if line.startswith(SEQUENCE_ERROR):
                self._held_line = line
            else:
                sys.stderr.write(line)
                sys.stderr.flush()
            if line.strip():
                self._last_line = line.strip()

    def _pass_on_held_line(self) -> None:
        if self._held_line:
            sys.stderr.write(self._held_line)
            sys.stderr.flush()
            self._held_line = ""

    def start(self) -> None:
        self._process = self._spawn()
        self._watch.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def silences(self) -> list[Silence]:
        """This sequencer, if its process runs and has not beaten for SILENT_AFTER seconds
        (one that exited is no silent process: its supervisor restarts it or says why not)."""
        silent = time.monotonic() - self._last_beat
        running = self._process is not None and self._process.poll() is None
        return [Silence(self._name, self.pid, silent)] if running and silent >= SILENT_AFTER else []

    def _wait(self) -> int:
        """Until the child exits, reading its heartbeats; a child silent for
        SEQUENCER_SILENT_LIMIT is killed."""
        self._left_for = None
        while True:
            readable, _, _ = select.select([self._beats], [], [], HEARTBEAT_EVERY)
            beats = os.read(self._beats, 4096) if readable else b""
            if beats:
                self._read_beats(beats)
            elif readable:  # the pipe's other end closed: the child is gone, or going
                return self._process.wait()
            code = self._process.poll()
            if code is not None:
                self._read_last_beats()
                return code
            silent = self.silences()
            if silent and silent[0].seconds >= SEQUENCER_SILENT_LIMIT and not self._stopping.is_set():
                print(f"{silent[0]}; killing it", file=sys.stderr, flush=True)
                self._process.kill()

    def _read_beats(self, beats: bytes) -> None:
        self._last_beat = time.monotonic()
        if SETTLED_BEAT in beats:
            self.settled.set()
        version = left_for(beats)
        if version is not None:
            self._left_for = version

    def _read_last_beats(self) -> None:
        """What an exited child wrote after the last look, its closing word included."""
        while select.select([self._beats], [], [], 0)[0]:
            beats = os.read(self._beats, 4096)
            if not beats:
                return
            self._read_beats(beats)

    def _supervise(self) -> None:
        fast_failures = 0
        while not self._stopping.is_set():
            started = time.monotonic()
            code = self._wait()
            self._relaying.join(5)  # the child's last words
            if self._stopping.is_set():
                self._pass_on_held_line()
                return
            if code == EXIT_UPGRADED:
                why = self._after_upgrade()
                if why is None:
                    return
                self._held_line = ""  # "its engine stops where the log moves on": it did not
                print(
                    f"{self._name} left as {self._log} moved on; {why}: starting it again", file=sys.stderr, flush=True
                )
                self.restarts += 1
                self._process = self._spawn()
                continue
            if code == EXIT_ANOTHER_ENGINE:  # restarting it would fence the other engine's, and so on
                self._stop_engine(self._last_line.removeprefix(SEQUENCE_ERROR) or f"exit status {code}")
                return
            self._pass_on_held_line()
            if code > 0 and self._broker is not None and self._broker.away_since(started):
                print(
                    f"{self._name} exited with {code} while the broker was away; restarting it when the broker answers",
                    file=sys.stderr,
                    flush=True,
                )
                self._broker.wait_until_back(self._stopping)
                if self._stopping.is_set():
                    return
                fast_failures = 0
            else:
                # A signal (negative code) is a kill from outside, not a failure of its own.
                fast_failures = fast_failures + 1 if code > 0 and time.monotonic() - started < FAST_FAILURE_S else 0
                if fast_failures >= FAST_FAILURES:
                    self._give_up(code)
                    return
                print(f"{self._name} exited with {code}; restarting", file=sys.stderr, flush=True)
            time.sleep(0.5)
            self.restarts += 1
            self._process = self._spawn()

    def _after_upgrade(self) -> str | None:
        """The child left because the log moved to a procedure set its app's code on disk is
        not (EXIT_UPGRADED). The engine then stops at that set's first batch, unless its
        workers have the set's code (read from disk while it was deployed, or the log's own
        for a set the log moved past, as after a rollback), and go on with it: they would
        wait for ever for batches without a sequencer. Wait until the engine stops (None),
        or runs the set the log runs, of a later version than the child left for (a set the
        child could not take up is taken up by a new one only from other files), or has run
        no batch for SEQUENCER_SILENT_LIMIT; then why to start the child again. Its start
        goes on, or is refused in one line, which stops the engine once it repeats
        (FAST_FAILURES): never a silent stall."""
        left_for = self._left_for or 0
        executed, progressed_at = None, time.monotonic()
        while not self._stopping.wait(UPGRADE_LOOK_EVERY):
            statuses = self._engine() if self._engine is not None else []
            now_executed = min((status["executed"] for status in statuses), default=None)
            if now_executed != executed:
                executed, progressed_at = now_executed, time.monotonic()
            runs = engine_set(statuses)
            if runs is not None:
                try:
                    current = current_set(self._bootstrap, self._log, 10)
                except Exception:
                    current = None  # the broker away: asked again on the next look
                if current is not None and current.identity == runs and current.version > left_for:
                    return f"the engine goes on with procedure set {current.name}, which the log runs"
            if time.monotonic() - progressed_at >= SEQUENCER_SILENT_LIMIT:
                return f"the engine has run no batch for {SEQUENCER_SILENT_LIMIT:.0f} s since"
        return None

    def _give_up(self, code: int) -> None:
        reason = self._last_line or f"exit status {code}"
        self._stop_engine(
            f"the {self._name} failed {FAST_FAILURES} times within {FAST_FAILURE_S:.0f} s of "
            f"starting, not restarting it: {reason}"
        )

    def _stop_engine(self, failure: str) -> None:
        self.failure = failure
        if self._on_failure is not None:
            self._on_failure()

    def stop(self, timeout: float = SEQUENCER_STOP_GRACE_S) -> None:
        self._stopping.set()
        if self._process is not None and self._process.poll() is None:
            if self.silences():  # a stopped process takes no SIGTERM
                self._process.kill()
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


def engine_set(statuses: list[dict]) -> int | None:
    """The procedure set every worker of an engine has upgraded to in place, as the log names
    it (their latest switch's); None before they all have, or where they differ."""
    latest = {status["switches"][-1][1] if status.get("switches") else None for status in statuses}
    return latest.pop() if len(latest) == 1 else None


class SequencerProcesses:
    """The S sequencers of `--sequencers S`, each a SequencerProcess."""

    def __init__(
        self,
        bootstrap: str,
        namespace: str,
        config: SequencerConfig,
        procedure_modules: tuple[str, ...] = (),
        on_failure: Callable[[], None] | None = None,
        broker: BrokerWatch | None = None,
        engine: Callable[[], list[dict]] | None = None,
    ):
        self.processes = [
            SequencerProcess(
                bootstrap,
                namespace,
                replace(config, index=k),
                procedure_modules,
                on_failure=on_failure,
                broker=broker,
                engine=engine,
            )
            for k in range(config.sequencers)
        ]

    def start(self) -> None:
        for process in self.processes:
            process.start()

    @property
    def restarts(self) -> int:
        return sum(process.restarts for process in self.processes)

    @property
    def settled(self) -> bool:
        """Whether every sequencer has said its lane is settled: its engine may serve."""
        return all(process.settled.is_set() for process in self.processes)

    @property
    def failure(self) -> str | None:
        """Why a sequencer was given up, if one was."""
        return next((process.failure for process in self.processes if process.failure), None)

    def silences(self) -> list[Silence]:
        return [silence for process in self.processes for silence in process.silences()]

    def stop(self, timeout: float = SEQUENCER_STOP_GRACE_S) -> None:
        for process in self.processes:
            process.stop(timeout)


def say_switches(statuses: list[dict], said: list[int]) -> None:
    """One line per upgrade in place, once every partition has made it."""
    from ordo.procedures.fingerprint import short

    made = min((len(status.get("switches") or ()) for status in statuses), default=0)
    for batch, identity in (statuses[0]["switches"] if made else [])[said[0] : made]:
        print(
            f"ordo run: procedures upgraded in place: set {short(identity)} from batch {batch} on",
            file=sys.stderr,
            flush=True,
        )
    said[0] = max(said[0], made)


def serve_all(
    bootstrap: str,
    namespace: str,
    data_dir: str,
    scheduler: str,
    partitions: int,
    request_partitions: int,
    config: SequencerConfig,
    quiet: bool = False,
    placement: dict | None = None,
    checkpointing: dict | None = None,
    log_replication: int = 1,
    metrics_port: int | None = None,
) -> int:
    from ordo.metrics import engine_observer
    from ordo.readiness import Readiness, log_end

    started = time.monotonic()
    placement = placement or {}
    check_layout(data_dir, partitions, namespace)  # a data directory of another namespace: before its topics exist
    ensure_topics(
        bootstrap,
        namespace,
        request_partitions,
        replication=log_replication,
        record_bytes=config.max_bytes + RECORD_FRAMING,
    )
    stopping.check()
    # Before Ray starts: a sequencer child would otherwise fail on it and be restarted forever.
    topics = Topics(namespace)
    partition_count = request_partitions_for(bootstrap, topics, config.sequencers)
    specs = placement.get("procedure_modules", ())
    registry = load_registry(specs)
    # Another app, or edited procedures, on a namespace: refused before anything runs or is written.
    check_set(bootstrap, namespace, registry, upgrade_command(bootstrap, namespace, specs), specs=tuple(specs))
    check_sources(bootstrap, registry.sources.values(), namespace)
    stopping.check()
    # One engine per namespace: before this one replays anything. Its sequencers, and any it
    # restarts, sequence for it (OWNER_ENV), so they never wait on each other's notes.
    os.environ[OWNER_ENV] = owner_env(
        f"ordo run (pid {os.getpid()} on {socket.gethostname()}, data dir {os.path.abspath(data_dir)})"
    )
    refuse_if_taken(
        bootstrap,
        namespace,
        sequencer_group(namespace),
        topics.requests,
        list(range(partition_count)),
        own_owner("ordo run"),
    )
    stopping.check()
    coordinator = Coordinator(
        bootstrap, namespace, data_dir, scheduler, partitions, **placement, **(checkpointing or {})
    )
    stopping.on_stop(coordinator.stop)  # from here on, a stop is the engine's: it ends after its batch
    broker = BrokerWatch(bootstrap)
    sequencer = SequencerProcesses(
        bootstrap,
        namespace,
        config,
        placement.get("procedure_modules", ()),
        on_failure=coordinator.stop,
        broker=broker,
        engine=lambda: coordinator.statuses,
    )
    on_checkpoint_signal(coordinator)
    announce_start(coordinator)
    try:  # before the sequencer's start record; a broker away now is waited for, not fatal
        end_before_start: int | None = log_end(coordinator, timeout=10.0)
    except Exception:
        end_before_start = None
    readiness = Readiness(end_before_start, started, sys.stderr, lambda: coordinator.log_end(timeout=0.5))
    broker.start()
    sequencer.start()
    sequencers = f"{config.sequencers} sequencers, " if config.sequencers > 1 else ""
    print(
        f"ordo running: namespace {namespace}, {sequencers}{scheduler} scheduler, {partitions} partition(s), "
        f"data in {data_dir}; Ctrl-C stops",
        file=sys.stderr,
        flush=True,
    )
    say_log_order(scheduler)
    progress, close_observer = engine_observer(
        coordinator,
        bootstrap,
        namespace,
        quiet,
        metrics_port,
        sequencer,
        readiness=readiness,
        sources=tuple(registry.sources),
    )

    # Nothing is executed or published before the sequencers' lanes are settled: the loser
    # of two `ordo run`s started at once stops without having served (Sequencer.settled).
    held = [True]
    coordinator.start(hold_at=coordinator.cursor.next_batch - 1)

    said_switches = [0]

    def observe(stats) -> None:
        if held[0] and sequencer.settled:
            coordinator.group.hold(None)
            held[0] = False
        say_switches(coordinator.statuses, said_switches)
        readiness.check(coordinator.statuses)
        if progress is not None:
            progress(stats)

    try:
        coordinator.run(progress=observe)
    finally:
        close_observer()
        sequencer.stop()
        broker.stop()
    if sequencer.failure is not None:
        raise RuntimeError(sequencer.failure)
    print(f"stopped after batch {coordinator.stats.last_batch}", file=sys.stderr, flush=True)
    return 0
