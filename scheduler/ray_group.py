"""Partition workers as Ray actors: each in a process of its own, pinned to a core, owning
one RocksDB shard and following the log itself. Participants of multi-partition
transactions exchange values over sockets of their own (`scheduler.socket_exchange`),
one message per peer per scheduling step."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from ordo.scheduler.follower import FollowOptions, LogFollower
from ordo.scheduler.liveness import CALL_TIMEOUT, SILENT_AFTER, Silence
from ordo.scheduler.outputs import CollectedOutputs
from ordo.scheduler.socket_exchange import SocketExchange
from ordo.scheduler.worker import PartitionWorker


class WorkerDied(RuntimeError):
    """A partition worker's process is gone: its shard must be recovered before going on."""


class WorkerSilent(RuntimeError):
    """A partition worker did not answer a call within its timeout."""


# How long a status poll waits for the workers' answers before it goes on with the last
# answers of those that have not answered yet.
STATUS_WAIT = 1.0
# How long stopping waits for each worker to take the stop, and to close.
STOP_WAIT = 10.0


@ray.remote
class PartitionActor:
    def __init__(
        self,
        core: int | None,
        data_dir: str,
        partition: int,
        partitions: int,
        scheduler: str,
        sync: bool,
        procedure_modules: tuple[str, ...],
    ):
        if core is not None:
            os.sched_setaffinity(0, {core})
        self.exchange = SocketExchange(partition)
        self.follower: LogFollower | None = None
        # A shard that cannot be opened (a full disk, a corrupt shard) is said by the first
        # call, whole: an error in __init__ reaches the engine only as Ray's text about a
        # creation task, without the shard or the cause.
        self.unopened: Exception | None = None
        try:
            self.worker = PartitionWorker(
                data_dir, partition, partitions, scheduler, None, self.exchange, sync, procedure_modules
            )
        except Exception as exc:
            self.unopened = exc

    async def listen(self, on_cluster: bool) -> tuple[str, int]:
        """Where peers reach this worker: 127.0.0.1 on one machine, this node's address
        on a cluster."""
        if self.unopened is not None:
            raise self.unopened
        return await self.exchange.listen(ray.util.get_node_ip_address() if on_cluster else "127.0.0.1")

    async def connect(self, addresses: dict[int, tuple[str, int]]) -> None:
        await self.exchange.connect(addresses)

    async def follow(self, options: FollowOptions) -> dict[str, Any]:
        """Follow the log until stopped (a call that lasts as long as the worker runs)."""
        self.follower = LogFollower(self.worker, options)
        return await self.follower.run()

    async def status(self) -> dict[str, Any]:
        if self.follower is not None:
            return self.follower.status()
        # Asked before `follow` has begun (calls from one caller may overtake each other):
        # what the shard says, and that nothing runs yet.
        marker = self.worker.applied()
        applied = marker["batch"] if marker else 0
        next_offset = marker["cursor"]["next_offset"] if marker else 0
        return {
            "partition": self.worker.partition,
            "executed": applied,
            "applied": applied,
            "applied_at": 0.0,
            "applied_offset": next_offset,
            "applied_txns": 0,
            "unapplied": 0,
            "next_offset": next_offset,
            "read_batch": applied,
            "position": next_offset,
            "ready": 0,
            "committed": 0,
            "aborted": 0,
            "rejected": 0,
            "checkpointed": [],
            "running": False,
            "error": None,
        }

    async def hold(self, batch_id: int | None) -> None:
        if self.follower is not None:
            self.follower.hold_at = batch_id

    async def stop(self) -> None:
        if self.follower is not None:
            self.follower.stop()

    async def collected(self) -> CollectedOutputs | None:
        sink = self.follower.sink if self.follower is not None else None
        return sink if isinstance(sink, CollectedOutputs) else None

    async def applied(self) -> dict[str, Any] | None:
        return self.worker.applied()

    async def checkpoint(self, path: str) -> dict[str, Any] | None:
        return self.worker.checkpoint(path)

    async def where(self) -> dict[str, Any]:
        return {
            "partition": self.worker.partition,
            "pid": os.getpid(),
            "cores": sorted(os.sched_getaffinity(0)),
            "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "node": ray.get_runtime_context().get_node_id(),
        }

    async def close(self) -> None:
        """Stop following first (what was executed is applied once its outputs are out),
        then close: the shard must not close under a batch being applied."""
        if self.follower is not None:
            self.follower.stop()
            for _ in range(1000):
                if not self.follower.running:
                    break
                await asyncio.sleep(0.01)
            self.follower.close()
        self.exchange.close()
        if self.unopened is None:
            self.worker.close()


def start_ray(address: str | None = None) -> None:
    """Join `address`, or start Ray on this machine listening on 127.0.0.1 only, with its
    dashboard off (scheduler/loopback.py), its processes stopping when this one ends."""
    if ray.is_initialized():
        return
    with signal_handlers_kept():
        _init_ray(address)


@contextlib.contextmanager
def signal_handlers_kept():
    """Ray's driver installs a handler of its own for SIGTERM, which aborts the process: the
    process's own handlers (a stop is a request, answered where the engine is) are put back."""
    main = threading.current_thread() is threading.main_thread()
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if callable(handler):
                signal.signal(sig, handler)


def _init_ray(address: str | None) -> None:
    if address:
        ray.init(address=address, logging_level="WARNING")
    else:
        import psutil

        from ordo.lifeline import stop_with_owner
        from ordo.scheduler.loopback import LOOPBACK, check_node_address, keep_node_address_on_loopback

        keep_node_address_on_loopback()
        # Ray announces that it turned on token authentication, its default for a new local
        # cluster, on every start; the cluster keeps it, the log loses the line.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        # address="local": a Ray of its own, never the cluster a `ray start` (or another
        # process's test cluster) last noted in /tmp/ray on this machine.
        context = ray.init(
            address="local",
            include_dashboard=False,
            _node_ip_address=LOOPBACK,
            logging_level="WARNING",
            num_cpus=os.cpu_count(),
            # Ray starts its workers at niceness 15 (background work): on a busy machine the
            # broker, the sequencer and the clients, all at 0, preempted the partition workers,
            # which took three times as long for the same batches (docs/benchmarks.md).
            _system_config={"worker_niceness": 0},
        )
        # The GCS and the raylet die with this process (the kernel's parent-death signal); the
        # dashboard agents under the raylet notice only a minute later, workers with their raylet.
        stop_with_owner([p.pid for p in psutil.Process().children(recursive=True) if p.pid not in before])
        check_node_address(context.address_info.get("node_ip_address", LOOPBACK))


class RayGroup:
    def __init__(
        self,
        data_dir: str,
        partitions: int,
        scheduler: str,
        sync: bool = False,
        procedure_modules: tuple[str, ...] = (),
        address: str | None = None,
        cores: list[int] | None = None,
    ):
        start_ray(address)
        nodes = sorted(node["NodeID"] for node in ray.nodes() if node["Alive"])
        self.partitions = partitions
        cores = cores if cores is not None else list(range(os.cpu_count() or 1))
        # num_cpus=0: pinning, not Ray's CPU accounting, decides where workers run, so
        # more partitions than cores still start.
        options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1000}
        if address:
            # Workers on a cluster do not inherit this process's environment: the Kafka
            # settings (broker/client_settings.py) travel with them.
            kafka_env = {k: v for k, v in os.environ.items() if k.startswith("ORDO_KAFKA_")}
            if kafka_env:
                options["runtime_env"] = {"env_vars": kafka_env}
        self.actors = [
            PartitionActor.options(**options, **_placement(p, nodes)).remote(
                cores[p % len(cores)] if cores else None,
                os.path.abspath(data_dir),
                p,
                partitions,
                scheduler,
                sync,
                tuple(procedure_modules),
            )
            for p in range(partitions)
        ]
        self._where: list[dict[str, Any]] = []
        self._silent: set[int] = set()  # partitions that let a call time out
        # A worker's first call waits for its process to start, which takes Ray seconds.
        addresses = dict(
            enumerate(
                self._get(
                    [actor.listen.remote(bool(address)) for actor in self.actors], timeout=max(CALL_TIMEOUT, 120.0)
                )
            )
        )
        self._get([actor.connect.remote(addresses) for actor in self.actors])
        self._where = self._get([actor.where.remote() for actor in self.actors])
        self._runs: list = []
        self._finished: set = set()
        # The status call outstanding to each worker (None: answered), when it was sent,
        # and each worker's last answer.
        self._asked: list = [None] * partitions
        self._asked_at = [0.0] * partitions
        self._last: list[dict[str, Any] | None] = [None] * partitions

    def _get(self, refs: list, timeout: float = CALL_TIMEOUT) -> list:
        """The answers to one call per worker (refs in partition order), each within `timeout`."""
        started = time.monotonic()
        try:
            return ray.get(refs, timeout=timeout)
        except GetTimeoutError:
            _, waiting = ray.wait(refs, num_returns=len(refs), timeout=0)
            silent = [p for p, ref in enumerate(refs) if ref in waiting]
            self._silent.update(silent)
            raise WorkerSilent(
                "; ".join(str(self._silence(p, time.monotonic() - started)) for p in silent)
                + ": restart the engine to recover (the shards are restored or replayed as after "
                "a crash)"
            ) from None
        except RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if cause is not None and not isinstance(cause, RayActorError):
                raise cause from None  # the worker's own error, without Ray's wrapping
            raise
        except RayActorError as exc:
            dead = [p for p, actor in enumerate(self.actors) if not _alive(actor)]
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise WorkerDied(
                f"partition worker(s) {dead or '?'} died ({first_line}); restart the engine to "
                "recover: the shards are restored from the last checkpoint if they disagree, "
                "then the log is replayed"
            ) from None

    def applied(self) -> list[dict[str, Any] | None]:
        return self._get([actor.applied.remote() for actor in self.actors])

    def start(self, options: FollowOptions) -> None:
        self._runs = [actor.follow.remote(options) for actor in self.actors]

    def drive(self, seconds: float) -> bool:
        pending = [ref for ref in self._runs if ref not in self._finished]
        if pending:
            done, _ = ray.wait(pending, num_returns=1, timeout=seconds)
            for ref in done:
                self._get([ref])  # raises what the worker raised
                self._finished.add(ref)
        return len(self._finished) == len(self._runs)

    def status(self) -> list[dict[str, Any]]:
        """Every worker's status: its answer to this poll, or, from a worker that has not
        answered yet, its last answer with how long this poll has waited for it
        (`unanswered_s`, from SILENT_AFTER on) and its `pid`. Never waits for a silent
        worker beyond STATUS_WAIT (CALL_TIMEOUT for a first answer)."""
        now = time.monotonic()
        for p, actor in enumerate(self.actors):
            if self._asked[p] is None:
                self._asked[p], self._asked_at[p] = actor.status.remote(), now
        first = any(last is None for last in self._last)
        ready, _ = ray.wait(
            list(self._asked), num_returns=len(self._asked), timeout=CALL_TIMEOUT if first else STATUS_WAIT
        )
        for p, ref in enumerate(self._asked):
            if ref in ready:
                self._last[p] = self._get([ref])[0]
                self._asked[p] = None
                self._silent.discard(p)
        missing = [p for p, last in enumerate(self._last) if last is None]
        if missing:
            self._silent.update(missing)
            raise WorkerSilent(
                "; ".join(str(self._silence(p, time.monotonic() - self._asked_at[p])) for p in missing)
                + ": restart the engine"
            )
        now = time.monotonic()
        return [
            {**last, "pid": self._where[p]["pid"], "unanswered_s": self._unanswered(p, now)}
            for p, last in enumerate(self._last)
        ]

    def _unanswered(self, partition: int, now: float) -> float:
        if self._asked[partition] is None:
            return 0.0
        waited = now - self._asked_at[partition]
        return waited if waited >= SILENT_AFTER else 0.0

    def _silence(self, partition: int, seconds: float) -> Silence:
        return Silence(f"partition {partition}", self._where[partition]["pid"] if self._where else None, seconds)

    def hold(self, batch_id: int | None) -> None:
        self._get([actor.hold.remote(batch_id) for actor in self.actors])

    def stop(self) -> None:
        """Ask every worker to stop; raises WorkerSilent for workers that do not take it."""
        try:
            self._get([actor.stop.remote() for actor in self.actors], timeout=STOP_WAIT)
        except WorkerSilent:
            now = time.monotonic()
            silent = "; ".join(str(self._silence(p, self._silent_for(p, now))) for p in sorted(self._silent))
            raise WorkerSilent(
                f"{silent}: stopped without waiting for it; restart the engine to recover (the "
                "shards are restored or replayed as after a crash)"
            ) from None

    def _silent_for(self, partition: int, now: float) -> float:
        """Since the oldest call this worker has not answered."""
        return now - self._asked_at[partition] if self._asked[partition] is not None else STOP_WAIT

    def collected(self) -> list[CollectedOutputs]:
        return [c for c in self._get([actor.collected.remote() for actor in self.actors]) if c is not None]

    def checkpoint(self, paths: list[str]) -> list[dict[str, Any] | None]:
        return self._get([actor.checkpoint.remote(path) for actor, path in zip(self.actors, paths)])

    def where(self) -> list[dict[str, Any]]:
        return list(self._where)

    def close(self) -> None:
        """Close every worker, then end its actor. A worker that let a call time out is not
        waited for, and with one such, neither are the others (they may be waiting for it):
        they are killed, as in a crash, which recovery is made for."""
        if not self._silent:
            # Each close awaited on its own: ray.get of the list would raise the first failure
            # and leave the others to Ray, which prints each as an "unhandled error" traceback.
            for closing in [actor.close.remote() for actor in self.actors]:
                try:
                    ray.get(closing, timeout=30)
                except Exception:
                    pass  # a dead worker has nothing left to close; a shard that failed said so already
        else:
            self._kill_processes()
        for actor in self.actors:
            ray.kill(actor)

    def _kill_processes(self) -> None:
        """SIGKILL the workers' processes on this machine: a stopped process (SIGSTOP) takes
        no other signal, and Ray ending it would leave it behind."""
        here = ray.get_runtime_context().get_node_id()
        for worker in self._where:
            if worker["node"] == here:
                try:
                    os.kill(worker["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _placement(partition: int, nodes: list[str]) -> dict[str, Any]:
    """On a cluster, partition p goes to node p mod the node count: Ray's own SPREAD is a
    preference it may ignore for actors that reserve no CPU."""
    if len(nodes) < 2:
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[partition % len(nodes)], soft=False)}


def _alive(actor) -> bool:
    try:
        ray.get(actor.applied.remote(), timeout=5)
        return True
    except Exception:
        return False
