"""What every configuration model of tidings is built from: the strict base model,
durations, and paths relative to the configuration file.

Every file tidings reads (``tidings.yaml``, the event server's file, an aggregation's file)
is validated by models built on these, so a duration is written the same way everywhere
(``250ms``, ``30s``, ``7d``), an unknown key is an error everywhere, and a relative path means
the file's directory wherever the process starts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    TypeAdapter,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from tidings.errors import ConfigError
from tidings.redaction import shown_url

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


#: Built once: building it took a millisecond, paid per duration of every configuration a
#: Spark task decodes.
_TIMEDELTA = TypeAdapter(timedelta)


def parse_duration(value: Any) -> timedelta:
    """Parse ``"30m"``, ``"250ms"``, ``"7d"`` or a number of seconds into a timedelta."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return timedelta(seconds=value)
    if isinstance(value, str) and (m := _DURATION.match(value)):
        return timedelta(seconds=float(m.group(1)) * _UNIT_SECONDS[m.group(2)])
    if isinstance(value, str) and value.startswith("P"):  # ISO 8601, as model_dump_json writes
        return _TIMEDELTA.validate_python(value)
    raise ValueError(f"not a duration: {value!r} (use e.g. 250ms, 30s, 30m, 2h, 7d)")


def parsed_durations(*fields: str, nullable: bool = False) -> Any:
    """A before-validator of a model's :data:`Duration` ``fields``, parsing what a file holds
    with :func:`parse_duration` (``nullable``: None stays None), assigned in the class body
    (``_durations = parsed_durations("tick", "timeout")``).

    It parses ahead of the field's own checks, so that a bound's error shows the value as a
    duration (``got 2d``), not as written."""

    def parse(cls: type, value: Any) -> Any:
        return None if nullable and value is None else parse_duration(value)

    return field_validator(*fields, mode="before")(parse)


#: In the JSON Schema a duration is what a file may hold: ``"250ms"``, ``"30m"``, an ISO 8601
#: duration (what a dump writes) or a number of seconds. A model using it parses its values
#: with :func:`parse_duration` in a ``field_validator(..., mode="before")``.
Duration = Annotated[
    timedelta,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*(ms|s|m|h|d)\s*$|^P"},
                {"type": "number", "minimum": 0},
            ],
            "format": "duration",
        }
    ),
]

#: Units for the bounds of :func:`within`.
ZERO = timedelta(0)
MS = timedelta(milliseconds=1)
SECOND = timedelta(seconds=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def spoken_duration(value: timedelta) -> str:
    """A duration as a person writes it: ``250ms``, ``30s``, ``5m``, ``2h``, ``7d``."""
    seconds = value.total_seconds()
    if not seconds:
        return "0s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds * 1000:g}ms"


def within(low: timedelta, high: timedelta, *, zero: bool = False) -> AfterValidator:
    """A bound for a :data:`Duration` field: more than ``low`` (or equal, with ``zero``: then
    ``low`` is usually 0, a value that means something documented) and at most ``high``.

    Every interval in a configuration has one: ``0s`` for a polling interval made an idle
    server burn a core, and a year-long timeout is a typo, not a choice."""

    def check(value: timedelta) -> timedelta:
        too_small = value < low if zero else value <= low
        if too_small or value > high:
            above = "at least" if zero else "more than"
            low_text, high_text = spoken_duration(low), spoken_duration(high)
            raise ValueError(f"must be {above} {low_text} and at most {high_text}")
        return value

    return AfterValidator(check)


#: A :data:`Duration` that parses itself, for models without a before-validator per field.
ParsedDuration = Annotated[Duration, BeforeValidator(parse_duration)]


def resolve_path(path: str | Path, base_dir: Path) -> Path:
    """``path`` with ``~`` expanded, made absolute against ``base_dir`` if it is relative.

    Configuration files use it so that their relative paths mean the file's directory,
    not whatever directory the process happens to start in.
    """
    path = Path(os.path.expanduser(path))
    return path if path.is_absolute() else base_dir / path


def resolve_location(location: str, base_dir: Path) -> str:
    """A directory or file: a local path is resolved, a URI (``hdfs://``, ``s3a://``,
    ``file:///``) is left to the system that reads it."""
    return location if "://" in location else str(resolve_path(location, base_dir))


def resolve_database_url(url: str, base_dir: Path) -> str:
    """A SQLite URL's file resolved against ``base_dir``; other URLs, in-memory and
    ``file:`` URI databases are left as they are."""
    if not url.startswith("sqlite"):
        return url
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ValueError(f"not a database URL: {shown_url(url)}") from None
    database = parsed.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return url
    resolved = parsed.set(database=str(resolve_path(database, base_dir)))
    return resolved.render_as_string(hide_password=False)


def _relative_to_config_file(resolve: Callable[[str, Path], str]) -> AfterValidator:
    """Resolve the value against the ``base_dir`` of the validation context, if any
    (:func:`tidings.config.tidings_file.load_config_file` gives the file's directory; other
    loaders give none)."""

    def validate(value: str, info: ValidationInfo) -> str:
        base_dir: Path | None = (info.context or {}).get("base_dir")
        return value if base_dir is None else resolve(value, base_dir)

    return AfterValidator(validate)


#: A local file or directory (or a URI), relative to the configuration file.
LocalPath = Annotated[str, _relative_to_config_file(resolve_location)]
#: A database URL; a relative SQLite file is relative to the configuration file.
DatabaseUrl = Annotated[str, _relative_to_config_file(resolve_database_url)]
#: Defaults are resolved too: a file that leaves a path out means the same default path
#: beside it, from whichever directory it is loaded. A field of one of the path types above
#: says so with ``Field(default=..., validate_default=True)``; this is the same, spread into
#: ``Field`` (``**RESOLVED_DEFAULT``), for the models that still write it so.
RESOLVED_DEFAULT: dict[str, Any] = {"validate_default": True}


V = TypeVar("V")


def as_value_error(check: Callable[[V], object], value: V) -> None:
    """Run a check that raises ConfigError inside a pydantic validator (which reports
    ValueErrors with the key path)."""
    try:
        check(value)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


#: Where clients without an identity are served from: the Eventer's and the intermediaries'
#: ``anonymous.allowed_from`` (one rule, :func:`tidings.address.is_loopback`).
AnonymousFrom: TypeAlias = Literal["loopback", "anywhere", "nowhere"]


class StrictModel(BaseModel):
    """The base of every configuration model of tidings: an unknown key is an error (a typo
    must not pass silently) and a validated configuration cannot be changed.

    A field's ``Field(description=...)`` says what the key means: it is the key's description
    in the JSON Schema and in the configuration reference.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
