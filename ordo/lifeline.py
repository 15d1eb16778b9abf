"""Servers that must not outlive the process that started them.

A child process can be tied to its parent by the kernel (PR_SET_PDEATHSIG, as the brokers
and the sequencer are), but not every server is: PostgreSQL under `pg_ctl start`
daemonizes and is nobody's child, and Ray's dashboard agents, children of a raylet that
dies with its driver, notice only a minute later. When their owner is stopped by a SIGTERM
or SIGKILL that no handler of the owner's sees, nothing would stop them.

A lifeline is a small watcher process in a session of its own, one per owner process,
holding the read end of a pipe whose write end only the owner holds. The owner tells it,
through the pipe, what to stop. The kernel closes the pipe however the owner ends, SIGKILL
and a normal exit included; the watcher then reads end-of-file and stops what it was told
of that is still there: each process still alive and still the same one (a pid can be
reused), a server gently first, and each server's directory.

    stop_with_owner([pid, ...])                     # by SIGKILL
    stop_server_with_owner(pid_file, directory)     # SIGQUIT, then SIGKILL; then rm -r directory
    stop_descendants_with_owner()                   # everything started from now on, by SIGKILL

The last is for a test session, whose tests start `ordo run` and brokers in many ways:
every process started after it carries OWNER_ENV in its environment (as its own children
do), and the watcher, which runs without it, kills each one that is still there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import psutil

# How long a server has to go after its stop signal before it is killed outright.
GRACE_S = 10.0
# Not ORDO_-prefixed: a command started with every ORDO_* setting cleared is still marked.
OWNER_ENV = "LIFELINE_OWNER"


class Lifeline:
    def __init__(self) -> None:
        read_end, self._write_end = os.pipe()  # close-on-exec: no other child inherits the write end
        try:
            subprocess.Popen(
                [sys.executable, "-m", "ordo.lifeline", str(read_end)],
                pass_fds=(read_end,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env={k: v for k, v in os.environ.items() if k != OWNER_ENV},  # not one to stop
                start_new_session=True,
            )  # a Ctrl-C to the owner's process group does not reach it
        finally:
            os.close(read_end)

    def tell(self, message: dict) -> None:
        try:
            os.write(self._write_end, (json.dumps(message) + "\n").encode())
        except BrokenPipeError:  # the watcher was killed: nothing would be stopped, and nothing else changes
            pass


_lifelines: dict[int, Lifeline] = {}  # by owner pid: a forked child needs its own


def _lifeline() -> Lifeline:
    return _lifelines.get(os.getpid()) or _lifelines.setdefault(os.getpid(), Lifeline())


def stop_with_owner(pids: list[int]) -> None:
    """Processes to SIGKILL when this process ends, if they are still there."""
    _lifeline().tell({"pids": list(pids)})


def stop_server_with_owner(pid_file: str, directory: str, stop_signal: int = signal.SIGQUIT) -> None:
    """A daemon to stop when this process ends: the one whose pid `pid_file` holds on its
    first line (read then, so the file may appear later), signalled with `stop_signal`
    (PostgreSQL's immediate shutdown is SIGQUIT) only if its command line names `directory`;
    then `directory` is removed."""
    _lifeline().tell({"pid_file": pid_file, "directory": directory, "signal": int(stop_signal)})


def stop_descendants_with_owner() -> None:
    """Every process this one starts from now on, and every process those start, to SIGKILL
    when this process ends, if it is still there: they carry OWNER_ENV, naming this process
    (its pid and start time), in their environment."""
    me = psutil.Process()
    os.environ[OWNER_ENV] = f"{me.pid}:{me.create_time()}"
    _lifeline().tell({"environ": [OWNER_ENV, os.environ[OWNER_ENV]]})


def _marked(name: str, value: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get(name) == value:
                found.append(process)
        except psutil.Error:
            pass  # gone, or not ours to read
    return found


def _process(pid: int, created: float | None = None, names: str | None = None) -> psutil.Process | None:
    """The live process `pid`, if it is still the one meant: started at `created`, or with
    `names` in its command line."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        if created is not None and process.create_time() != created:
            return None
        if names is not None and names not in " ".join(process.cmdline()):
            return None
        return process
    except psutil.Error:
        return None


def _stop(process: psutil.Process, stop_signal: int) -> None:
    try:
        process.send_signal(stop_signal)
        if stop_signal != signal.SIGKILL:
            try:
                process.wait(GRACE_S)
            except psutil.TimeoutExpired:
                process.kill()
    except psutil.Error:
        pass  # gone already


def _pid_in(pid_file: str) -> int | None:
    try:
        with open(pid_file) as f:
            return int(f.readline().strip())
    except (OSError, ValueError):
        return None


def _watch(read_end: int) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the owner's end decides, not a signal meant for the owner
    processes: list[psutil.Process] = []
    servers: list[dict] = []
    marks: list[tuple[str, str]] = []
    with os.fdopen(read_end, "r") as pipe:
        for line in pipe:
            message = json.loads(line)
            if "environ" in message:
                marks.append(tuple(message["environ"]))
            elif "pids" in message:  # identified now, by start time, so a reused pid is never hit
                processes.extend(p for pid in message["pids"] if (p := _process(pid)) is not None)
            else:
                servers.append(message)
    for name, value in marks:
        for _ in range(5):  # again, for any started while the others were being killed
            marked = _marked(name, value)
            if not marked:
                break
            for process in marked:
                _stop(process, signal.SIGKILL)
    for process in processes:
        if _process(process.pid, process.create_time()) is not None:
            _stop(process, signal.SIGKILL)
    for server in servers:
        pid = _pid_in(server["pid_file"])
        process = _process(pid, names=server["directory"]) if pid is not None else None
        if process is not None:
            _stop(process, server["signal"])
        shutil.rmtree(server["directory"], ignore_errors=True)


if __name__ == "__main__":
    _watch(int(sys.argv[1]))
