"""Every option from the command line, ORDO_<OPTION> or a TOML file, in that precedence;
a setting that cannot be used is one clear error naming where it came from."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ordo import config
from ordo.cli import build_parser
from ordo.sequencer.sequencer import SequencerConfig
from tests.helpers import ROOT


def parse(argv: list[str], environ: dict[str, str]):
    parser = build_parser()
    config.add_common_options(parser)
    config.apply(parser, argv, environ)
    args = parser.parse_args(config.without_config(argv))
    config.check_parsed(args)
    return args


@pytest.fixture
def settings(tmp_path):
    path = tmp_path / "ordo.toml"
    path.write_text(
        'bootstrap_servers = "file:1"\n'
        'namespace = "from-file"\n'
        "partitions = 3\n"
        "[run]\n"
        'data-dir = "/from/file"\n'
        'app = ["bank:app", "shop:app"]\n'
        "quiet = true\n"
        "checkpoint-every = 7\n"
    )
    return str(path)


def test_precedence_is_command_line_then_environment_then_file_then_default(settings):
    args = parse(["run", "--config", settings], {})
    assert (args.bootstrap_servers, args.namespace, args.partitions, args.data_dir) == (
        "file:1",
        "from-file",
        3,
        "/from/file",
    )
    assert args.app == ["bank:app", "shop:app"] and args.quiet is True and args.checkpoint_every == 7
    assert (
        args.scheduler == "serial" and args.max_txns == SequencerConfig().max_txns
    )  # defaults where nothing says otherwise

    environ = {
        "ORDO_CONFIG": settings,
        "ORDO_NAMESPACE": "from-env",
        "ORDO_PARTITIONS": "2",
        "ORDO_QUIET": "false",
        "ORDO_APP": "env:app,other:app",
        "ORDO_SCHEDULER": "vll",
    }
    args = parse(["run"], environ)
    assert (args.bootstrap_servers, args.namespace, args.partitions, args.scheduler) == ("file:1", "from-env", 2, "vll")
    assert args.quiet is False and args.app == ["env:app", "other:app"]

    args = parse(["run", "--namespace", "cli", "--partitions", "4", "--quiet"], environ)
    assert (args.namespace, args.partitions, args.quiet) == ("cli", 4, True)


def test_a_required_option_may_come_from_the_environment():
    args = parse(["execute", "--data-dir", "d"], {"ORDO_BOOTSTRAP_SERVERS": "env:9"})
    assert args.bootstrap_servers == "env:9"
    with pytest.raises(SystemExit):  # and without it, still required
        parse(["execute", "--data-dir", "d"], {})


def test_a_nested_command_has_a_table_of_its_own(tmp_path):
    path = tmp_path / "ordo.toml"
    path.write_text('[spark.produce]\nnamespace = "from-file"\n')
    args = parse(["spark", "produce", "--bootstrap-servers", "b:1", "--input", "x.csv", "--config", str(path)], {})
    assert args.namespace == "from-file"


def test_top_level_settings_apply_only_to_commands_that_have_the_option(settings):
    args = parse(["--config", settings, "gen", "micro"], {})  # gen has no --namespace: not an error
    assert not hasattr(args, "namespace") and args.count == 1000


@pytest.mark.parametrize(
    "text, environ, message",
    [
        (
            'bootstrap_server = "x"\n',
            {},
            "unknown setting 'bootstrap-server' at the top level (did you mean 'bootstrap-servers'?)",
        ),
        ("[run]\ncount = 3\n", {}, "unknown setting 'count' at the [run]"),
        ("[rnu]\npartitions = 2\n", {}, "[rnu] is not a command (did you mean [run]?)"),
        ("[spark.prodcue]\ncount = 2\n", {}, "[spark.prodcue] is not a command (did you mean [spark.produce]?)"),
        ('[run]\npartitions = "two"\n', {}, "[run]: --partitions: 'two' is not an integer of 1 or more"),
        ('[run]\nscheduler = "fifo"\n', {}, "--scheduler: 'fifo' is not one of serial, locking, vll, opchain"),
        ("partitions = [", {}, "is not valid TOML"),
        ("", {"ORDO_QUIET": "maybe"}, "ORDO_QUIET: --quiet: expected true or false, got 'maybe'"),
    ],
)
def test_a_bad_setting_names_its_source(tmp_path, text, environ, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as caught:
        parse(["run", "--config", str(path), "--bootstrap-servers", "h:1", "--data-dir", "d"], environ)
    assert message in str(caught.value)


def test_the_messages_running_md_quotes_are_the_ones_given(tmp_path, monkeypatch):
    with open(os.path.join(ROOT, "docs", "running.md")) as f:
        doc = " ".join(f.read().split())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ordo.toml").write_text('bootstrap-server = "127.0.0.1:9092"\n')
    for argv, environ in [(["--config", "ordo.toml"], {}), ([], {"ORDO_PARTITIONS": "two"})]:
        with pytest.raises(config.ConfigError) as caught:
            parse(["run", *argv, "--bootstrap-servers", "h:1", "--data-dir", "d"], environ)
        assert f"`{caught.value}`" in doc, str(caught.value)


@pytest.mark.parametrize(
    "text, environ, override",
    [
        ('[run]\npartitions = "two"\n', {}, ["--partitions", "2"]),
        ('[run]\nscheduler = "fifo"\n', {}, ["--scheduler", "vll"]),
        ("", {"ORDO_QUIET": "maybe"}, ["--quiet"]),
    ],
)
def test_a_bad_setting_that_the_command_line_overrides_is_not_used(tmp_path, text, environ, override):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    args = parse(["run", "--config", str(path), "--bootstrap-servers", "h:1", "--data-dir", "d", *override], environ)
    given = {"--partitions": ("partitions", 2), "--scheduler": ("scheduler", "vll"), "--quiet": ("quiet", True)}
    dest, value = given[override[0]]
    assert getattr(args, dest) == value


def test_the_command_line_tool_overrides_a_bad_file_setting(tmp_path):
    path = tmp_path / "ordo.toml"
    path.write_text('[gen]\ncount = "many"\n')
    assert cli("gen", "micro", "--config", str(path), "--count", "2").stdout.count("\n") == 2
    unused = cli("gen", "micro", "--config", str(path))
    assert unused.returncode == 2 and unused.stderr.strip().startswith(f"ordo: {path} [gen]: --count: ")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ordo.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
        timeout=60,
    )


def test_the_command_line_tool_reads_the_environment_and_the_file(tmp_path):
    path = tmp_path / "ordo.toml"
    path.write_text("[gen]\ncount = 2\nseed = 5\n")
    lines = lambda done: done.stdout.splitlines()  # noqa: E731
    assert len(lines(cli("gen", "micro", "--config", str(path)))) == 2
    from_env = cli("gen", "micro", env={"ORDO_CONFIG": str(path), "ORDO_COUNT": "3"})
    assert len(lines(from_env)) == 3
    assert lines(from_env)[:2] == lines(cli("gen", "micro", "--config", str(path)))  # seed 5 from the file
    assert len(lines(cli("gen", "micro", "--count", "1", env={"ORDO_CONFIG": str(path), "ORDO_COUNT": "3"}))) == 1
    missing = cli("gen", "micro", "--config", str(tmp_path / "nope.toml"))
    assert (
        missing.returncode == 2
        and missing.stderr.strip() == f"ordo: configuration file {tmp_path}/nope.toml does not exist"
    )
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("ordo ")


@pytest.mark.slow
def test_the_log_level_reaches_the_sequencer_that_ordo_run_starts(broker, namespace, tmp_path):
    import queue
    import threading

    from tests.helpers import stop

    process = subprocess.Popen(
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
            "--quiet",
            "--log-level",
            "info",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stderr], daemon=True).start()
    try:
        while True:
            line = lines.get(timeout=60)
            if " INFO ordo.sequencer: " in line:  # logged by the child, at the level given to the parent
                break
    finally:
        assert stop(process) == 0
