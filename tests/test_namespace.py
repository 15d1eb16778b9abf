"""Everything Ordo imports is under `ordo.`: a user's own modules named like Ordo's
components (storage.py, procedures.py, sequencer.py, …) beside an app shadow nothing, and
an app module may itself be called procedures.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ordo.client import Client
from tests.helpers import stop

COMPONENTS = ("sequencer", "scheduler", "storage", "recovery", "procedures", "spark_jobs")

pytestmark = pytest.mark.slow

SHOP = textwrap.dedent("""
    import ordo
    from ordo import Int

    import storage  # the user's own module, not Ordo's

    app = ordo.App("shop")
    app.table("stock", default=storage.OPENING_STOCK)

    @app.procedure(args={"item": Int(0), "qty": Int(1)}, keys=[("stock", "item")])
    def sell(ctx, args):
        left = ctx.read("stock", args["item"]) - args["qty"]
        if left < 0:
            ctx.abort("sold out")
        ctx.write("stock", args["item"], left)
        return left
""")


def _user_dir(tmp_path, app_module: str):
    tmp_path.mkdir()
    (tmp_path / "storage.py").write_text("OPENING_STOCK = 5\n")
    for name in COMPONENTS:
        if name not in ("storage", app_module):  # each would break Ordo if it shadowed Ordo's own
            (tmp_path / f"{name}.py").write_text(f"raise ImportError('the user\\'s own {name}.py was imported')\n")
    (tmp_path / f"{app_module}.py").write_text(SHOP)
    return tmp_path


@pytest.mark.parametrize("app_module", ["shop", "procedures"])
def test_modules_of_a_user_named_like_ordo_s_components_shadow_nothing(broker, namespace, tmp_path, app_module):
    user_dir = _user_dir(tmp_path / "user", app_module)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # as a user's shell has it
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ordo.cli",
            "run",
            "--bootstrap-servers",
            broker,
            "--namespace",
            namespace,
            "--data-dir",
            str(tmp_path / "d"),
            "--app",
            f"{app_module}:app",
            "--partitions",
            "2",
            "--runtime",
            "ray",
            "--quiet",
        ],
        cwd=user_dir,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with Client(broker, namespace) as client:
            client.wait_for_topics(120)
            first = client.submit("sell", {"item": 1, "qty": 3})
            second = client.submit("sell", {"item": 1, "qty": 3})
            outcomes = client.wait([first, second], timeout=180)
        assert engine.poll() is None, engine.stderr.read()
    finally:
        assert stop(engine) == 0
    assert (outcomes[first]["status"], outcomes[first]["result"]) == ("committed", 2)
    assert (outcomes[second]["status"], outcomes[second]["error"]) == ("aborted", "sold out")
    assert "Traceback" not in engine.stderr.read()
