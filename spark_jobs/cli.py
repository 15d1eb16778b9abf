"""`ordo spark …`: the border jobs on the command line.

    ordo spark produce --bootstrap-servers B --namespace NS --input PATH --format csv|json|parquet
                       [--stream [--once | --timeout S] [--checkpoint DIR]] [--master M]
                       [--id-col C] [--proc-col C | --proc NAME] [--args-col C | --args-cols A,B|*]
                       [--app MODULE:ATTR] [--workloads a,b] [--wait [--wait-timeout S]]
    (--app/--workloads: cast each --args-cols cell to its procedure's argument type;
     --wait: then count the requests' outcomes, committed, aborted and rejected)
    ordo spark changes --bootstrap-servers B --namespace NS --output DIR --checkpoint DIR
                       [--once | --timeout S] [--master M] [--max-records-per-batch N]
                       [--optimize-every N | --optimize] [--no-internal-tables]
    (the change data into a Delta Lake lake: change log, state tables, exactly once)
    ordo spark samples [--out DIR] [--count N]

Importing this module does not import pyspark: `ordo --help` stays fast.
"""

from __future__ import annotations

import argparse


def add_spark_commands(subparsers) -> argparse.ArgumentParser:
    """Add `spark` with its sub-commands to the `ordo` parser's subparsers. Each parsed
    command carries its handler as `args.spark_handler`."""
    from ordo.spark_jobs import changes_job, producer_job

    spark = subparsers.add_parser("spark", help="PySpark border jobs: datasets to requests, changes to Delta Lake")
    sub = spark.add_subparsers(dest="spark_command", required=True, metavar="JOB")

    p = sub.add_parser(
        "produce",
        help="publish a dataset (CSV, JSON lines, Parquet) as requests",
        description=producer_job.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    producer_job.add_arguments(p)
    p.set_defaults(spark_handler=cmd_produce)

    p = sub.add_parser(
        "changes",
        help="land <ns>.changes in Delta Lake: a change log and current-state tables, exactly once",
        description=changes_job.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    changes_job.add_arguments(p)
    # A stop signal ends its stream between micro-batches, then it sums up (ordo/stopping.py).
    p.set_defaults(spark_handler=cmd_changes, answers_stops=True)

    p = sub.add_parser("samples", help="write the sample datasets (sl, micro, bad rows)")
    p.add_argument("--out", default=None, metavar="DIR", help="default: spark_jobs/samples")
    p.add_argument("--count", type=int, default=300, help="requests per workload (default 300)")
    p.set_defaults(spark_handler=cmd_samples)
    return spark


def cmd_produce(args) -> int:
    from ordo.spark_jobs import producer_job

    return producer_job.run(args)


def cmd_changes(args) -> int:
    from ordo.spark_jobs import changes_job

    return changes_job.run(args)


def cmd_samples(args) -> int:
    from ordo.spark_jobs import samples

    for path in samples.write_samples(args.out or samples.SAMPLES_DIR, args.count):
        print(path)
    return 0


def run_spark_command(args) -> int:
    return args.spark_handler(args)
