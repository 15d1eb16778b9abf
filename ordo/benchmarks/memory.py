"""Peak resident memory per process role."""

from __future__ import annotations

import os
import threading


def _vm_hwm_mb(pid: int) -> float:
    """Peak resident memory of a process since it started (or since it was reset)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def reset_own_peak() -> bool:
    # The engine process is this (long-lived) process: reset its high-water mark so each
    # configuration reports its own peak. Linux: 5 > /proc/PID/clear_refs.
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class MemoryWatch:
    """Peak resident memory per role: psutil samples every 50 ms, and the kernel's
    high-water mark where it covers only this configuration."""

    def __init__(self, roles: dict[str, list[int]], exact: set[str]):
        import psutil

        self._psutil = psutil
        self.roles = roles
        self.exact = exact  # roles whose VmHWM is this configuration's own
        self.peaks = {role: 0.0 for role in roles}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def _rss_mb(self, pid: int) -> float:
        try:
            return self._psutil.Process(pid).memory_info().rss / 2**20
        except (self._psutil.Error, OSError):
            return 0.0

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            for role, pids in self.roles.items():
                self.peaks[role] = max(self.peaks[role], max((self._rss_mb(p) for p in pids), default=0.0))

    def stop(self) -> dict[str, float]:
        """Call while the processes still run (the high-water marks are read now)."""
        self._stop.set()
        self._thread.join(2)
        for role in self.exact:
            self.peaks[role] = max(self.peaks[role], max((_vm_hwm_mb(p) for p in self.roles[role]), default=0.0))
        return {role: round(peak, 1) for role, peak in self.peaks.items()}
