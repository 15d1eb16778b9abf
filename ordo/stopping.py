"""SIGINT and SIGTERM, taken from a command's first moment to its last.

`install()` comes first in the `ordo` entry point, before the imports that take a second
or more: from then on a stop signal is never the default action (status -15 or 143, no
line), only a request, which the command answers where it is:

- during start-up, at the steps that `check()`: `StopRequested`, one line, status 0;
- once it serves, through the callbacks given to `on_stop` (the engine finishes its batch);
- whatever it waits on, within `exit_within`'s bound: a process whose broker is gone waits
  in its Kafka clients' close (a consumer's, a producer's flush) for tens of seconds, and
  nothing it holds needs that close: the log is the truth and the shards are crash-safe.

Commands that stop by KeyboardInterrupt, as Python's default has it, `release()` the
signals once they are parsed.

Only this module's own names and the standard library are imported here: it is imported
first, and stays quick.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How long `ordo run`, `ordo sequence` and `ordo execute` have to stop after a stop signal.
# A stop takes a few seconds, with its broker gone too; a partition worker that does not
# answer is given 10 s before it is killed and named (scheduler/ray_group.py). Past this,
# what is left to wait for is a broker that does not answer.
SERVICE_STOP_S = 15.0

_requested = threading.Event()
_received: list[str] = []  # the first stop signal's name
_callbacks: list[Callable[[], None]] = []
_deadline: list[tuple[float, Callable[[], str]]] = []
_armed = threading.Event()
_installed = threading.Event()


class StopRequested(Exception):
    """A stop signal came before the command began to serve: it ends here, cleanly."""

    def __init__(self) -> None:
        super().__init__(f"stopped by {signal_name()} before it began")


def install() -> None:
    """Take SIGINT and SIGTERM as stop requests (from the main thread only, as Python has it)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _handle)
    _installed.set()


def take_back() -> None:
    """Take the signals back from a library that took them for itself (a SparkContext takes
    SIGINT, to raise KeyboardInterrupt inside its calls into the JVM), where install() had
    taken them."""
    if _installed.is_set():
        install()


def release() -> None:
    """Back to Python's defaults (SIGINT raises KeyboardInterrupt); a stop requested before is
    answered now."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _installed.clear()
    check()


def requested() -> bool:
    return _requested.is_set()


def signal_name() -> str:
    return _received[0] if _received else "a stop signal"


def check() -> None:
    """Raise StopRequested if a stop signal has come: a step of start-up asks before it begins."""
    if _requested.is_set():
        raise StopRequested()


def on_stop(callback: Callable[[], None]) -> None:
    """Call `callback` on a stop signal, at once if one has come already."""
    _callbacks.append(callback)
    if _requested.is_set():
        callback()


def exit_within(seconds: float, line: Callable[[], str]) -> None:
    """Once a stop signal has come, give the process `seconds` to end; then print `line()` and
    exit with status 0 without waiting longer for anything."""
    _deadline[:] = [(seconds, line)]
    if _requested.is_set():
        _arm()


def _handle(signum: int, frame) -> None:
    if not _requested.is_set():
        _received.append(signal.Signals(signum).name)
        _requested.set()
        _arm()
    for callback in list(_callbacks):
        callback()


def _arm() -> None:
    if not _deadline or _armed.is_set():
        return
    _armed.set()
    seconds, line = _deadline[0]
    threading.Thread(target=_exit_after, args=(seconds, line), name="stop deadline", daemon=True).start()


def _exit_after(seconds: float, line: Callable[[], str]) -> None:
    threading.Event().wait(seconds)
    try:
        sys.stderr.write(line() + "\n")
        sys.stderr.flush()
    finally:
        os._exit(0)
