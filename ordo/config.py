"""Every command-line option also from the environment and from a TOML file.

Precedence: command line > environment > file > built-in default.

- environment: `ORDO_<OPTION>`, the long option in capitals with dashes as underscores:
  `--bootstrap-servers` is `ORDO_BOOTSTRAP_SERVERS`, `--data-dir` is `ORDO_DATA_DIR`;
  flags take 1/0, true/false, yes/no, on/off; repeatable options a comma-separated list.
- file: `--config FILE` (before or after the command) or `ORDO_CONFIG`. Top-level keys
  apply to every command that has the option, a `[command]` table only to that command
  (`[spark.border]` to a nested one); keys are option names, with dashes or underscores.
  A key no command knows is an error, so a misspelling does not pass silently; a value
  that cannot be used is an error only where the command line does not override it.

    bootstrap-servers = "127.0.0.1:9092"
    namespace = "bank"

    [run]
    data-dir = "/var/lib/ordo"
    partitions = 2
    app = ["bank:app"]
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import tomllib
from typing import Any, Iterator, Mapping

PREFIX = "ORDO_"
SKIP = {"help", "config", "version"}
TRUE, FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def integer_between(low: int, high: int | None = None):
    """An argparse type: an integer from `low` to `high`; the error names the range, and
    argparse (or ordo.config, for ORDO_* and the settings file) names the option."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            within = f"of {low:,} or more" if high is None else f"from {low:,} to {high:,}"
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer {within}")
        return value

    return parse


def seconds_between(low: float, high: float, *, above: bool = False):
    """An argparse type: a finite number from `low` (excluded with `above`) to `high`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value > low if above else value >= low) or not value <= high:  # NaN fails both
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number {'above' if above else 'from'} {low:g} "
                f"{'and at most' if above else 'to'} {high:,g}"
            )
        return value

    return parse


# A wait longer than a day is a typing mistake.
WAIT_S = seconds_between(0, 86_400)


class ConfigError(ValueError):
    """A setting from the environment or the file that cannot be used; says which."""


def option_name(action: argparse.Action) -> str | None:
    """`bootstrap-servers` for --bootstrap-servers; None for positionals and help."""
    longs = [s for s in action.option_strings if s.startswith("--")]
    if not longs:
        return None
    name = max(longs, key=len)[2:]
    return None if name in SKIP else name


def env_name(option: str) -> str:
    return PREFIX + option.upper().replace("-", "_")


def config_path(argv: list[str], environ: Mapping[str, str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return environ.get(PREFIX + "CONFIG") or None


def load_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(command path, parser) of the top level and of every command, nested ones too."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, path + (name,))


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {name: action for action in parser._actions if (name := option_name(action))}


def apply(parser: argparse.ArgumentParser, argv: list[str], environ: Mapping[str, str] | None = None) -> None:
    """Turn the file's and the environment's settings into the parsers' defaults, so that
    the command line still wins and `--help` shows where a default came from."""
    environ = os.environ if environ is None else environ
    path = config_path(argv, environ)
    settings = load_file(path) if path else {}
    every = list(commands(parser))
    known = {name for _, p in every for name in options(p)}
    top = {_key(k): v for k, v in settings.items() if not isinstance(v, dict)}
    _check_keys(path, (), top, known)
    _check_sections(path, settings, (), {command for command, _ in every})
    for command, sub in every:
        opts = options(sub)
        values: dict[str, tuple[Any, str]] = {}
        for key, value in top.items():
            if key in opts:
                values[key] = (value, f"{path}")
        section = settings
        for name in command:
            section = section.get(name, {}) if isinstance(section, dict) else {}
        if command and isinstance(section, dict):
            own = {_key(k): v for k, v in section.items() if not isinstance(v, dict)}
            _check_keys(path, command, own, set(opts))
            values.update((k, (v, f"{path} [{'.'.join(command)}]")) for k, v in own.items())
        for name in opts:
            if env_name(name) in environ:
                values[name] = (environ[env_name(name)], env_name(name))
        for name, (value, source) in values.items():
            _set_default(sub, opts[name], name, value, source)


def _key(key: str) -> str:
    return key.replace("_", "-")


def _check_keys(path: str | None, command: tuple[str, ...], keys: Mapping[str, Any], known: set[str]) -> None:
    for key in keys:
        if key not in known:
            where = f"[{'.'.join(command)}]" if command else "top level"
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{path}: unknown setting '{key}' at the {where}{hint}")


def _check_sections(path: str | None, table: Mapping[str, Any], at: tuple[str, ...], known: set) -> None:
    for key, value in table.items():
        if isinstance(value, dict):
            section = (*at, key)
            if section not in known:
                names = sorted(".".join(c) for c in known if c)
                close = difflib.get_close_matches(".".join(section), names, n=1)
                hint = f" (did you mean [{close[0]}]?)" if close else ""
                raise ConfigError(f"{path}: [{'.'.join(section)}] is not a command{hint}")
            _check_sections(path, value, section, known)


class _Unusable:
    """A default from the environment or the file that cannot be used: an error only if the
    command line does not give the option (checked by `check_parsed`)."""

    def __init__(self, error: ConfigError) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"<unusable: {self.error}>"


def check_parsed(args: argparse.Namespace) -> None:
    """Raise the ConfigError of the first setting that the command line did not override."""
    for value in vars(args).values():
        if isinstance(value, _Unusable):
            raise value.error


def _set_default(parser: argparse.ArgumentParser, action: argparse.Action, name: str, value: Any, source: str) -> None:
    try:
        converted = _convert(action, name, value, source)
    except ConfigError as exc:
        converted = _Unusable(exc)
    action.default = converted
    action.required = False  # given by the environment or the file
    parser.set_defaults(**{action.dest: converted})


def _convert(action: argparse.Action, name: str, value: Any, source: str) -> Any:
    def fail(why: str) -> ConfigError:
        return ConfigError(f"{source}: --{name}: {why}")

    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if isinstance(value, bool):
            flag = value
        elif isinstance(value, str) and value.strip().lower() in TRUE | FALSE:
            flag = value.strip().lower() in TRUE
        else:
            raise fail(f"expected true or false, got {value!r}")
        return flag if isinstance(action, argparse._StoreTrueAction) else not flag
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [v for v in str(value).split(",") if v.strip()]
        return [_one(action, str(item).strip() if isinstance(item, str) else item, fail) for item in items]
    if isinstance(value, (dict, list)):
        raise fail(f"expected one value, got {value!r}")
    return _one(action, value, fail)


def _one(action: argparse.Action, value: Any, fail) -> Any:
    if isinstance(value, bool):
        raise fail(f"expected a value, got {value!r}")
    text = value if isinstance(value, str) else str(value)
    if action.type is not None:
        try:
            value = action.type(text)
        except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
            raise fail(str(exc) or f"invalid value {text!r}") from None
    else:
        value = text
    if action.choices is not None and value not in action.choices:
        raise fail(f"{value!r} is not one of {', '.join(map(str, action.choices))}")
    return value


LOG_LEVELS = ("debug", "info", "warning", "error")


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """`--version` and `--config` on `ordo` itself, `--log-level` on every command."""
    from ordo import __version__

    parser.add_argument("--version", action="version", version=f"ordo {__version__}")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="settings file (TOML); also ORDO_CONFIG. Every option can also come from "
        "ORDO_<OPTION>; the command line wins, then the environment, then the file",
    )
    for command, sub in commands(parser):
        if command and "log_level" not in {a.dest for a in sub._actions}:
            sub.add_argument(
                "--log-level",
                choices=LOG_LEVELS,
                default="warning",
                help="what Ordo logs to standard error (default %(default)s)",
            )


def without_config(argv: list[str]) -> list[str]:
    """The arguments without `--config FILE` (read already, wherever it stood)."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == "--config" and i + 1 < len(argv):
            skip = True
        elif not arg.startswith("--config="):
            out.append(arg)
    return out


def setup_logging(args: argparse.Namespace) -> None:
    import logging

    level = getattr(args, "log_level", None) or "warning"
    logging.basicConfig(level=getattr(logging, level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # librdkafka repeats connection failures for as long as a broker is away; Ordo says
    # what fails in one line of its own, so its lines show only when asked for.
    logging.getLogger("ordo.librdkafka").setLevel(logging.DEBUG if level in ("debug", "info") else logging.CRITICAL)
