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
    from ordo.sequencer.broker import local_broker

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
    return lambda line: _fault_reports.append(f"{request.node.name}: {line}")


def pytest_terminal_summary(terminalreporter):
    if _fault_reports:
        terminalreporter.section("faults injected")
        for line in _fault_reports:
            terminalreporter.write_line(line)
