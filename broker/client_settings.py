"""librdkafka settings a user gives every Kafka client Ordo creates: security (SASL, SSL),
timeouts, client ids, anything librdkafka knows.

Two sources, the environment winning over the file:

- a file, `--kafka-config FILE` or `ORDO_KAFKA_CONFIG=FILE`: Java-style properties
  (`security.protocol=SASL_SSL`), TOML or JSON (by the file's extension; TOML tables
  nest, so `[sasl]` with `mechanism = "PLAIN"` is `sasl.mechanism`);
- the environment, `ORDO_KAFKA_<SETTING>`: the setting's name in capitals with dots as
  underscores, `ORDO_KAFKA_SECURITY_PROTOCOL=SASL_SSL` is `security.protocol`; a double
  underscore stands for an underscore of the name (`ORDO_KAFKA_LOG__LEVEL` is `log_level`).

What Ordo sets for a client itself wins over both: the bootstrap servers, group ids,
transactional ids (`ordo upgrade`'s), idempotence, isolation, the consumers' fetch timing. A setting
librdkafka does not know, or a value it refuses, is one error naming the setting and
where it came from, before any client starts.

The functions below take the environment and the file's text as arguments, so a general
configuration (a TOML file, ORDO_ options) can feed them its own values.
"""

from __future__ import annotations

import json
import logging
import os
import tomllib
from typing import Any, Mapping

ENV_PREFIX = "ORDO_KAFKA_"
FILE_ENV = "ORDO_KAFKA_CONFIG"  # the file; also what `--kafka-config` sets for child processes
ENV_SOURCE = "the environment (ORDO_KAFKA_*)"


class KafkaSettingsError(ValueError):
    """A Kafka setting from the user that cannot be used; names it and its source."""


def setting_from_env_name(name: str) -> str | None:
    """`ORDO_KAFKA_SECURITY_PROTOCOL` -> `security.protocol`; None for other names and
    for ORDO_KAFKA_CONFIG (the file)."""
    if not name.startswith(ENV_PREFIX) or name == FILE_ENV or len(name) == len(ENV_PREFIX):
        return None
    rest = name[len(ENV_PREFIX) :].lower()
    return ".".join(part.replace("\0", "_") for part in rest.replace("__", "\0").split("_"))


def env_name_for(setting: str) -> str:
    """The inverse of setting_from_env_name: `log_level` -> `ORDO_KAFKA_LOG__LEVEL`."""
    return ENV_PREFIX + setting.replace("_", "__").replace(".", "_").upper()


def settings_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    settings = {}
    for name in sorted(environ):
        setting = setting_from_env_name(name)
        if setting is not None:
            settings[setting] = environ[name]
    return settings


def parse_settings_text(text: str, kind: str, source: str = "the Kafka settings") -> dict[str, str]:
    """Settings from a file's text; `kind` is "json", "toml" or "properties"."""
    if kind == "json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise KafkaSettingsError(f"{source}: not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise KafkaSettingsError(f"{source}: expected a JSON object of settings")
        return _flat(data, source)
    if kind == "toml":
        try:
            return _flat(tomllib.loads(text), source)
        except tomllib.TOMLDecodeError as exc:
            raise KafkaSettingsError(f"{source}: not valid TOML: {exc}") from None
    settings = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if cut < 0:
            raise KafkaSettingsError(f"{source}, line {number}: expected name=value, got {line!r}")
        settings[line[:cut].strip()] = line[cut + 1 :].strip()
    return settings


def _flat(data: Mapping[str, Any], source: str, prefix: str = "") -> dict[str, str]:
    settings = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            settings.update(_flat(value, source, name + "."))
        elif isinstance(value, bool):
            settings[name] = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            settings[name] = str(value)
        elif isinstance(value, list) and all(isinstance(v, (str, int)) for v in value):
            settings[name] = ",".join(map(str, value))  # lists in librdkafka are comma-separated
        else:
            raise KafkaSettingsError(f"{source}: setting {name!r} has a value librdkafka cannot take: {value!r}")
    return settings


def file_kind(path: str) -> str:
    lowered = path.lower()
    return "json" if lowered.endswith(".json") else "toml" if lowered.endswith(".toml") else "properties"


def read_settings_file(path: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise KafkaSettingsError(f"Kafka settings file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise KafkaSettingsError(f"Kafka settings file {path}: not UTF-8 text (byte {exc.start})") from None
    return parse_settings_text(text, file_kind(path), f"Kafka settings file {path}")


def merge_kafka_settings(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Layers of settings, each later one winning name by name."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer)
    return merged


def user_layers(environ: Mapping[str, str] | None = None) -> list[tuple[str, dict[str, str]]]:
    """(source, settings) of the file and then the environment."""
    environ = os.environ if environ is None else environ
    layers = []
    path = environ.get(FILE_ENV)
    if path:
        layers.append((f"Kafka settings file {path}", read_settings_file(path)))
    from_env = settings_from_env(environ)
    if from_env:
        layers.append((ENV_SOURCE, from_env))
    return layers


def check_settings(source: str, settings: Mapping[str, str]) -> None:
    """Let librdkafka judge the settings of one source together (some depend on others),
    without connecting anywhere: its message names a setting it does not know or a value
    it refuses."""
    from confluent_kafka import KafkaException, Producer

    if not settings:
        return
    try:
        # A client is what judges settings; this one has no bootstrap servers, so it
        # never connects, and what it logs goes nowhere. Consumer-only settings pass (a
        # producer ignores them).
        Producer({**settings, "logger": _SILENT})
    except KafkaException as exc:
        error = exc.args[0]
        reason = error.str() if hasattr(error, "str") else str(error)
        named = [name for name in settings if f'"{name}"' in reason]
        where = f"{env_name_for(named[0])} in the environment" if named and source == ENV_SOURCE else source
        raise KafkaSettingsError(f"Kafka setting from {where}: {reason}") from None
    except (TypeError, ValueError) as exc:
        raise KafkaSettingsError(f"Kafka settings from {source}: {exc}") from None


_SILENT = logging.getLogger("ordo.kafka_settings.check")
_SILENT.addHandler(logging.NullHandler())
_SILENT.propagate = False

_cache: dict[tuple, dict[str, str]] = {}


def user_kafka_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The user's settings for every client: the file, then the environment, checked
    once per distinct input."""
    environ = os.environ if environ is None else environ
    path = environ.get(FILE_ENV)
    try:
        stamp = os.stat(path).st_mtime_ns if path else None
    except OSError:
        stamp = -1
    key = (path, stamp, tuple(sorted((k, v) for k, v in environ.items() if k.startswith(ENV_PREFIX))))
    if key not in _cache:
        layers = user_layers(environ)
        for source, settings in layers:
            check_settings(source, settings)
        _cache[key] = merge_kafka_settings(*(settings for _, settings in layers))
    return dict(_cache[key])
