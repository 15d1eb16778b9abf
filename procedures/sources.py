"""Existing topics as sources, as an app declares them (docs/procedures.md, "Existing
topics as sources"): `Source` names a topic, the procedure its records become requests of
and how; `SourceRecord` is one record as the mapping sees it. How a sequencer reads a
source topic and keeps its positions in the log is sequencer/sources.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class SourceRecord:
    """One record of a source topic, as the mapping sees it. `headers`: (name, value)
    pairs in the record's order."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    _parsed: list = field(default_factory=list, init=False, repr=False, compare=False)

    def json(self) -> Any:
        """The value parsed as JSON (once); ValueError naming what is wrong otherwise."""
        if not self._parsed:
            if self.value is None:
                raise ValueError("the record has no value")
            try:
                self._parsed.append(json.loads(self.value))
            except ValueError as exc:
                raise ValueError(f"the value is not JSON: {exc}") from None
        return self._parsed[0]

    def header(self, name: str) -> bytes | None:
        """The value of the last header called `name`, or None."""
        found = [value for key, value in self.headers if key == name]
        return found[-1] if found else None


@dataclass(frozen=True)
class Source:
    """Records of the Kafka topic `topic` become requests of procedure `proc`. `args`: a
    function of the `SourceRecord` giving the arguments (default: the value, a JSON
    object, as they are); `id`: a function giving the request id (default: the record's
    place, `topic:partition:offset`, so each record is one request for ever)."""

    topic: str
    proc: str
    args: Callable[[SourceRecord], dict] | None = None
    id: Callable[[SourceRecord], str] | None = None

    def __post_init__(self) -> None:
        from ordo.broker.topics import valid_topic

        if not isinstance(self.topic, str) or not valid_topic(self.topic):
            raise ValueError(f"Source: {self.topic!r} is no Kafka topic name (1-249 of A-Z a-z 0-9 . _ -)")
        if not isinstance(self.proc, str) or not self.proc:
            raise TypeError(f"Source('{self.topic}'): proc= names the procedure its records become requests of")
        for part in ("args", "id"):
            value = getattr(self, part)
            if value is not None and not callable(value):
                raise TypeError(f"Source('{self.topic}'): {part}= takes a function of the record, got {value!r}")
