"""Delta Lake in the border jobs' Spark session: its jars from Maven Central and the
settings that make `format("delta")`, `MERGE` and `OPTIMIZE` work.

    python -m spark_jobs.delta_lake     # the jars, comma-separated (for spark-submit --jars)

Version: `io.delta:delta-spark_<spark>_<scala>:<delta>`, the Delta release of the installed
`delta-spark` Python package built for the installed Spark's major.minor; when Maven Central
has none of that exact release (PyPI can publish a patch release before Central does), the
newest release tested with Ordo, `FALLBACK_VERSION`, of the same minor release. Set
`ORDO_DELTA_VERSION` to choose.

Delta's session extension and catalog are static settings: they must be in place when the
session starts (spark_jobs/session.py puts them there; under spark-submit, pass them with
`--conf`, docs/spark.md).
"""

from __future__ import annotations

import os
import sys

from ordo.maven import Artifacts
from ordo.spark_jobs.jars import class_loadable, resolve, scala_version, spark_version

VERSION_ENV = "ORDO_DELTA_VERSION"
FALLBACK_VERSION = "4.4.0"
EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"

# Settings of a session that writes the lake. Delta computes a table's snapshot with as
# many tasks as `snapshotPartitions` (50 by default): on a machine of a few cores each of
# those tasks costs more than the work, so the lake's small logs are read in one.
SETTINGS = {
    "spark.sql.extensions": EXTENSION,
    "spark.sql.catalog.spark_catalog": CATALOG,
    "spark.databricks.delta.snapshotPartitions": "1",
}


def delta_release() -> str:
    from importlib.metadata import version

    return version("delta-spark")


def artifacts(version: str) -> Artifacts:
    spark = ".".join(spark_version().split(".")[:2])
    return Artifacts("delta-spark", (f"io.delta:delta-spark_{spark}_{scala_version()}:{version}",))


def candidate_versions() -> list[str]:
    chosen = os.environ.get(VERSION_ENV, "").strip()
    if chosen:
        return [chosen]
    installed = delta_release()
    same_minor = FALLBACK_VERSION.split(".")[:2] == installed.split(".")[:2]
    return [installed] + ([FALLBACK_VERSION] if same_minor and FALLBACK_VERSION != installed else [])


_resolved: list[str] | None = None


def delta_jars() -> list[str]:
    """Delta's jars with what they need that Spark does not ship; fetched once."""
    global _resolved
    if _resolved is None:
        _resolved = resolve("Delta Lake", [artifacts(v) for v in candidate_versions()], VERSION_ENV)
    return list(_resolved)


def ensure_delta(spark) -> None:
    """A session that started without Delta's extension cannot run the lake's MERGE: say
    how to start it, in one line."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if EXTENSION not in extensions.split(",") or not class_loadable(spark, EXTENSION):
        raise RuntimeError(
            "this Spark session was started without Delta Lake: under spark-submit pass "
            f'--jars "$(python -m spark_jobs.delta_lake)" --conf spark.sql.extensions={EXTENSION} '
            f"--conf spark.sql.catalog.spark_catalog={CATALOG}"
        )


def main() -> int:
    print(",".join(delta_jars()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
