"""Java artifacts from Maven Central, fetched once through Maven into a cache on disk.

Apache Kafka (the broker `ordo broker` runs) and Spark's Kafka connector are Maven artifacts.
Ordo names them here by coordinates, writes a one-dependency pom for each set, and has
`mvn dependency:copy-dependencies` put the jars with everything they depend on into
`$ORDO_CACHE_DIR` (default `~/.cache/ordo`). Later uses find them there and ask no network.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass


class MissingTool(RuntimeError):
    """Java or Maven is not installed: the message says what to install, in one line."""


@dataclass(frozen=True)
class Artifacts:
    """A named set of Maven coordinates (`group:artifact:version`) with their dependencies."""

    name: str
    coordinates: tuple[str, ...]

    @property
    def key(self) -> str:
        digest = hashlib.sha256("\n".join(self.coordinates).encode()).hexdigest()[:12]
        return f"{self.name}-{digest}"


def cache_dir() -> str:
    return os.environ.get("ORDO_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ordo")


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    candidate = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not candidate or not os.access(candidate, os.X_OK):
        raise MissingTool(
            "Apache Kafka needs a Java 17+ runtime and none was found (no `java` on PATH): install "
            "one (e.g. apt-get install openjdk-17-jre-headless), or run the memory-only fallback "
            "broker with --engine tansu (ORDO_BROKER_ENGINE=tansu)"
        )
    return candidate


def pom(artifacts: Artifacts) -> str:
    dependencies = "\n".join(
        "    <dependency><groupId>{}</groupId><artifactId>{}</artifactId><version>{}</version></dependency>".format(
            *coordinate.split(":")
        )
        for coordinate in artifacts.coordinates
    )
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>ordo.cache</groupId>
  <artifactId>{artifacts.name}</artifactId>
  <version>1</version>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""


def jars(artifacts: Artifacts) -> list[str]:
    """The jars of `artifacts` and their dependencies, fetched on first use."""
    folder = os.path.join(cache_dir(), "maven", artifacts.key)
    done = os.path.join(folder, "complete")
    if not os.path.exists(done):
        _fetch(artifacts, folder, done)
    return sorted(
        os.path.join(folder, "jars", name) for name in os.listdir(os.path.join(folder, "jars")) if name.endswith(".jar")
    )


def _fetch(artifacts: Artifacts, folder: str, done: str) -> None:
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    # Two processes starting at once (tests, a demo beside a broker) fetch once: the second
    # waits on the lock and then finds the set complete.
    with open(folder + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(done):
            return
        maven = shutil.which("mvn")
        if maven is None:
            raise MissingTool(
                f"fetching {artifacts.name} needs Maven and none was found (no `mvn` on PATH): install "
                f"it (e.g. apt-get install maven), or run the memory-only fallback broker with "
                f"--engine tansu (ORDO_BROKER_ENGINE=tansu)"
            )
        print(
            f"ordo: fetching {', '.join(artifacts.coordinates)} through Maven into {folder} (first use only)",
            file=sys.stderr,
            flush=True,
        )
        shutil.rmtree(folder, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="ordo-maven-") as work:
            with open(os.path.join(work, "pom.xml"), "w") as f:
                f.write(pom(artifacts))
            staging = os.path.join(work, "jars")
            result = subprocess.run(
                [
                    maven,
                    "-B",
                    "-q",
                    "dependency:copy-dependencies",
                    f"-DoutputDirectory={staging}",
                    "-DincludeScope=runtime",
                ],
                cwd=work,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
            )
            if result.returncode != 0:
                tail = " ".join((result.stdout + result.stderr).split())[-400:]
                raise RuntimeError(
                    f"Maven could not fetch {', '.join(artifacts.coordinates)} (exit {result.returncode}): {tail}"
                )
            os.makedirs(folder)
            shutil.move(staging, os.path.join(folder, "jars"))
        with open(done, "w") as f:
            f.write("\n".join(artifacts.coordinates) + "\n")
