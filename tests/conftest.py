import itertools
import os
import sys

# Keep every Ray address on loopback: when a driver joins a cluster at 127.0.0.1, Ray
# otherwise swaps in the machine's outward address, where nothing of ours listens.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from ordo.lifeline import stop_descendants_with_owner  # noqa: E402 (after the path is set)

# Nothing a test starts (`ordo run`, brokers, Ray, their children) outlives the session,
# even when it is stopped by SIGTERM or SIGKILL (ordo/lifeline.py).
stop_descendants_with_owner()

_namespaces = itertools.count(1)


@pytest.fixture(scope="session")
def broker():
    """One real Kafka-protocol broker (the local launcher) for the whole session."""
    from ordo.broker.local import local_broker

    with local_broker() as running:
        yield running.bootstrap_servers


@pytest.fixture
def namespace(request):
    """A fresh namespace per test, so tests never see each other's topics."""
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:40]
    return f"t{os.getpid()}-{next(_namespaces)}-{name}"


_fault_reports: list[str] = []


@pytest.fixture
def fault_report(request):
    """`fault_report("2 faults injected, 6000 requests checked")`: a line the session's
    summary prints under the test's name, so CI's output shows what each fault test did."""
    # A user property travels with the test's report from an xdist worker to the session
    # that prints the summary.
    return lambda line: request.node.user_properties.append(("fault_report", f"{request.node.name}: {line}"))


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        _fault_reports.extend(line for key, line in report.user_properties if key == "fault_report")


def pytest_terminal_summary(terminalreporter):
    if _fault_reports:
        terminalreporter.section("faults injected")
        for line in _fault_reports:
            terminalreporter.write_line(line)


# The suite mostly waits (brokers starting, outages sat through), so it runs on several
# xdist workers (addopts in pyproject.toml), which the scheduler below hands work in units:
#  - the tests that stop, kill and restart brokers for minutes and time what follows are one
#    unit, run one after another on one worker: never two outages at once (the other
#    workers' load lands on them, Spark jobs' included, as on any busy machine);
#  - a file whose tests share a module-scoped fixture (a log sequenced once, a PostgreSQL
#    server, a Spark session, a SASL broker) is one unit, so the fixture is set up once (a
#    file left off the list is still right, its fixture set up on each worker that needs it);
#  - every other test is a unit of its own.
# A name is a file, or a file and a test (all of its parameters).
ONE_AT_A_TIME = (
    "tests/test_broker_faults.py",
    "tests/test_live_reads.py::test_reads_through_a_broker_bounce_fail_within_their_timeout_and_answer_again_after",
    "tests/test_bench.py::test_bench_soak_bounces_the_broker_and_checks_every_request_once_against_a_serial_reading",
)
MODULE_FIXTURE_FILES = (
    "tests/benchmarks/test_hot_paths.py",
    "tests/test_bench.py",
    "tests/test_docker_compose.py",
    "tests/test_hardening_checkpoints.py",
    "tests/test_kafka_security.py",
    "tests/test_node_client.py",
    "tests/test_partitions.py",
    "tests/test_recovery.py",
    "tests/test_spark_jobs.py",
    "tests/test_tansu_broker.py",
)
# The longest tests, as the durations list measured them, start first (longest first): a
# worker that picks one up at the end would keep the whole run waiting on it.
LONGEST_FIRST = (
    "tests/test_broker_faults.py::test_a_broker_away_for_90_s_under_ordo_run_is_waited_for_and_nothing_is_lost_or_doubled",
    "tests/test_lake.py::test_the_lake_lands_every_change_once_through_kills_and_a_rebuild",
    "tests/test_spark_jobs.py::test_sample_dataset_through_producer_engine_and_consumer_equals_ordo_dump",
    "tests/test_spark_stops.py::test_a_second_change_job_into_the_same_lake_is_refused_in_one_line",
    "tests/test_spark_stops.py::test_a_stopped_change_job_ends_with_its_summary_and_no_traceback",
    "tests/test_spark_produce_types.py::test_one_bad_cell_is_one_rejected_row_and_every_other_row_commits",
    "tests/test_bench.py::test_bench_scale_takes_turns_over_rounds_and_compares_multi_partition_shares",
    "tests/test_recovery_crash.py::test_a_killed_ray_worker_stops_the_engine_and_a_restart_recovers",
    "tests/test_voter.py::test_external_client_sigkill_restart_and_every_scheduler_agree",
    "tests/test_hardening_liveness.py::test_a_stopped_partition_worker_is_named_and_sigterm_still_stops_the_engine",
    "tests/test_readme_example.py::test_the_readme_quick_start_runs_as_written",
    "tests/test_messages.py::test_a_mistyped_namespace_is_answered_with_the_namespaces_the_broker_has",
    "tests/test_hardening_liveness.py::test_a_stopped_sequencer_is_named_then_replaced",
    "tests/test_hardening_copies.py::test_a_copied_start_record_of_an_earlier_sequencer_count_is_said_not_a_silent_hang",
    "tests/test_recovery_crash.py::test_engine_sigkilled_again_and_again_ends_as_if_it_never_crashed",
    "tests/test_hardening_log.py::test_a_forged_start_record_stops_the_engine_instead_of_hiding_every_later_batch",
    "tests/test_versions.py::test_an_upgrade_under_load_stops_the_old_engine_at_its_batch_and_loses_nothing",
    "tests/test_bench_latency.py::test_bench_latency_end_to_end",
    "tests/test_hardening_log.py::test_a_broker_restarted_without_its_data_stops_the_engine_with_one_line_and_keeps_its_state",
    "tests/test_sequencer_startup.py::test_a_sequencer_on_a_namespace_without_topics_says_so_and_exits",
    "tests/test_alias_pipeline.py::test_alias_from_an_external_client_on_two_partitions",
)


def _named(nodeid: str, names: tuple[str, ...]) -> int | None:
    """The index of the first of `names` that names the test `nodeid`, or None."""
    path, _, test = nodeid.partition("::")
    for index, name in enumerate(names):
        if name == path or name == f"{path}::{test.split('[', 1)[0]}":
            return index
    return None


def _unit(nodeid: str) -> str:
    if _named(nodeid, ONE_AT_A_TIME) is not None:
        return "one at a time"
    path = nodeid.partition("::")[0]
    return path if path in MODULE_FIXTURE_FILES else nodeid


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)  # stable: everything else keeps its collection order


def _rank(item) -> int:
    index = _named(item.nodeid, LONGEST_FIRST)
    return len(LONGEST_FIRST) if index is None else index


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False  # units in collection order: the longest first
    return Units(config, log)
