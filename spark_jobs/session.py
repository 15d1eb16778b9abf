"""The SparkSession of Ordo's border jobs.

`local[*]` by default (or `--master`); on a local master the driver binds to 127.0.0.1
only; no UI; quiet logs. Kafka is Spark's own connector (`spark-sql-kafka-0-10`), the lake is
Delta Lake: their jars from Maven Central (spark_jobs/kafka_connector.py,
spark_jobs/delta_lake.py) in `spark.jars`, Delta's extension and catalog set. The record
codec runs in Python workers, pickled by value so that executors need pyarrow but not Ordo
itself.
"""

from __future__ import annotations

import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LOG4J = os.path.join(HERE, "log4j2.properties")
DEFAULT_MASTER = "local[*]"


def is_local(master: str) -> bool:
    return master == "local" or master.startswith(("local[", "local-"))


def build_session(
    app_name: str = "ordo-spark",
    master: str | None = None,
    shuffle_partitions: int | None = None,
    conf: dict[str, Any] | None = None,
    log_level: str = "ERROR",
):
    """A SparkSession for a border job. `master` defaults to $ORDO_SPARK_MASTER, else
    local[*]. Settings in `conf` win over the defaults here. Under spark-submit the session
    already exists and its static settings (master, driver host) are those of spark-submit."""
    from pyspark.sql import SparkSession

    from ordo.spark_jobs import delta_lake
    from ordo.spark_jobs.kafka_connector import connector_jars, ensure_connector

    master = master or os.environ.get("ORDO_SPARK_MASTER") or DEFAULT_MASTER
    # Python workers must run the interpreter of the driver (its packages: pyarrow).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if is_local(master):
        # Local Python workers can also import Ordo's packages by reference.
        path = os.environ.get("PYTHONPATH", "")
        if ROOT not in path.split(os.pathsep):
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, path) if p)
    settings: dict[str, Any] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions or (os.cpu_count() or 2)),
        "spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile=file:{LOG4J} -Dlog4j2.level=error",
        "spark.sql.session.timeZone": "UTC",
        # Streaming queries of the border jobs are few and small: no extra state store churn.
        "spark.sql.streaming.numRecentProgressUpdates": "20",
        **delta_lake.SETTINGS,
    }
    if is_local(master):
        settings.update(
            {
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.pyspark.python": sys.executable,
            }
        )
    settings.update({k: str(v) for k, v in (conf or {}).items()})
    # Spark's Kafka connector and Delta: jars from Maven Central (fetched once), not spark.jars.packages.
    settings["spark.jars"] = ",".join(
        [*filter(None, settings.get("spark.jars", "").split(",")), *connector_jars(), *delta_lake.delta_jars()]
    )
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    start_jvm(app_name, master, settings)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    ensure_connector(spark)  # a session that existed before (spark-submit) gets the jars now
    register_executor_modules()
    return spark


# What the driver's JVM says on standard error that no log setting reaches: its notice of
# the incubator module Spark's launcher always adds (`--add-modules=jdk.incubator.vector`).
JVM_NOTICES = (b"WARNING: Using incubator modules: ",)


def start_jvm(app_name: str, master: str, settings: dict[str, Any]) -> None:
    """Start the driver's JVM, as the session would, with its standard error (and its
    Python workers') passed on line by line without the JVM's notices. A JVM that is there
    already (an earlier session, spark-submit's) is left as it is."""
    import threading

    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    conf = SparkConf().setAppName(app_name).setMaster(master).setAll(list(settings.items()))
    read_end, write_end = os.pipe()
    threading.Thread(target=_pass_on_errors, args=(read_end,), name="spark-stderr", daemon=True).start()
    try:
        SparkContext._ensure_initialized(gateway=launch_gateway(conf, popen_kwargs={"stderr": write_end}))
    finally:
        os.close(write_end)  # the JVM holds its own copy: the reader ends when the JVM does


def _pass_on_errors(read_end: int) -> None:
    with os.fdopen(read_end, "rb") as lines:
        for line in lines:
            if not line.startswith(JVM_NOTICES):
                sys.stderr.write(line.decode(errors="replace"))
                sys.stderr.flush()


def register_executor_modules() -> None:
    """The module whose functions run on executors (the record codec) is pickled by value:
    executors need its third-party import (pyarrow) only, not Ordo."""
    from pyspark import cloudpickle

    from ordo.spark_jobs import records

    cloudpickle.register_pickle_by_value(records)


def ensure_importable() -> None:
    """For scripts run as `spark-submit spark_jobs/<job>.py`: make `spark_jobs` importable."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)


def job_main(prog: str, doc: str | None, add_arguments, run, argv: list[str] | None = None) -> int:
    """The spark-submit entry point of a job: parse its options, run it, and turn a
    user error into one line and exit status 2."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        if getattr(args, "kafka_config", None):  # for the executors too: they inherit the environment
            from ordo.broker.client_settings import FILE_ENV, user_kafka_settings

            os.environ[FILE_ENV] = os.path.abspath(args.kafka_config)
            user_kafka_settings()
        return run(args)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"{prog.removesuffix('.py')}: {exc}", file=sys.stderr)
        return 2
