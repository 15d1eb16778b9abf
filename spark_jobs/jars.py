"""The Java side of the border jobs: jars from Maven Central for the running Spark.

Spark's Kafka connector (spark_jobs/kafka_connector.py) and Delta Lake
(spark_jobs/delta_lake.py) are Maven artifacts built for one Spark release and one Scala
version. Each names its candidate versions, newest first; `resolve` fetches the first one
Maven Central serves (once, through ordo/maven.py) and leaves out the jars Spark ships
itself (Scala, Hadoop, compression codecs, SLF4J), so that Spark's own versions stay the
only ones on the class path.
"""

from __future__ import annotations

import os
import re
import sys

from ordo.maven import Artifacts, MissingTool, cache_dir, jars


def spark_version() -> str:
    import pyspark

    return pyspark.__version__


def spark_jars_dir() -> str | None:
    """Where the running Spark's own jars are: $SPARK_HOME/jars, else PySpark's."""
    home = os.environ.get("SPARK_HOME")
    candidates = [os.path.join(home, "jars")] if home else []
    try:
        import pyspark

        candidates.append(os.path.join(os.path.dirname(pyspark.__file__), "jars"))
    except ImportError:
        pass
    return next((c for c in candidates if os.path.isdir(c)), None)


def scala_version() -> str:
    """Scala's binary version of the installed Spark (from its spark-core jar's name)."""
    folder = spark_jars_dir()
    if folder:
        for name in os.listdir(folder):
            match = re.fullmatch(r"spark-core_(\d+\.\d+)-.*\.jar", name)
            if match:
                return match.group(1)
    return "2.13" if int(spark_version().split(".")[0]) >= 4 else "2.12"


def artifact_name(jar: str) -> str:
    """`kafka-clients-3.9.2.jar` -> `kafka-clients` (Maven names jars artifactId-version)."""
    match = re.fullmatch(r"(.+?)-(\d+(?:\.\d+)*(?:[.-][A-Za-z0-9]+)*)\.jar", os.path.basename(jar))
    return match.group(1) if match else os.path.basename(jar)


def fetched(artifacts: Artifacts) -> bool:
    """Already in the cache (ordo/maven.py's layout): using it needs no Maven run."""
    return os.path.exists(os.path.join(cache_dir(), "maven", artifacts.key, "complete"))


def resolve(what: str, candidates: list[Artifacts], version_env: str) -> list[str]:
    """The jars of the first of `candidates` that Maven Central serves (one already in the
    cache wins, so the choice is made once), less those Spark ships. Falling back from the
    first candidate is said in one line naming `version_env`, which picks a version."""
    cached = next((c for c in candidates if fetched(c)), None)
    errors = []
    for artifacts in [cached] if cached else candidates:
        try:
            found = jars(artifacts)
        except MissingTool:
            raise MissingTool(
                f"{what} is fetched once from Maven Central with Maven, and no `mvn` is on PATH: install it "
                f"(e.g. apt-get install maven)"
            ) from None
        except RuntimeError as exc:  # Maven ran and could not fetch this version
            errors.append(str(exc))
            continue
        if artifacts is not candidates[0] and cached is None:
            print(
                f"ordo: Maven Central has no {candidates[0].coordinates[0]}; using {artifacts.coordinates[0]} "
                f"instead (set {version_env} to choose)",
                file=sys.stderr,
                flush=True,
            )
        break
    else:
        raise RuntimeError(f"could not fetch {what}: " + " | ".join(errors))
    folder = spark_jars_dir()
    shipped = {artifact_name(name) for name in os.listdir(folder)} if folder else set()
    return [jar for jar in found if artifact_name(jar) not in shipped]


def class_loadable(spark, name: str) -> bool:
    jvm = spark.sparkContext._jvm
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(name, False, loader)
        return True
    except Exception:
        return False
