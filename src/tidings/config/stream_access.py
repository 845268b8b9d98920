"""What a stream user may do: the ``allow`` list under ``stream_users.<name>``.

Each entry of the list is a *grant*: the streams it is about, the FTN18 consumer components
the user may consume them as, the FTN18 types it may read there, the types it may generate
with ``addEvent``, and optionally a condition on the events' data (``where``, the filter of
FTN18 2.2.3, :mod:`tidings.events.data_filter`). Names are written as they are, or as
patterns where ``*`` stands for any run of characters (``BILLING_*``; ``*`` alone is every
name; the component ``LIVE`` is a name like the others).

Grants add up, as NATS' and Kafka's allow rules do: a user may consume a stream as a
component if some grant names both; an event reaches it if some such grant names its type
and that grant's ``where`` holds for the event's data (a grant without ``where`` passes every
event of its types); ``addEvent`` is allowed if some grant names the stream and lists the type
under ``add_event``, and its ``where`` holds for the new event's data (a user may generate
only what it could read). A user without ``allow`` may do everything: the access every user
had before permissions existed. ``stream_allow_required: true`` makes that an error.

Grants are checked against the streams when the file is loaded: a stream pattern that
matches no stream, or a type pattern that matches no type of the streams the grant names
(none they can generate, for ``add_event``), is refused, since a typo there would deny in
silence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from tidings.config.model import StrictModel
from tidings.config.stream_types import generated_type
from tidings.errors import ConfigError
from tidings.events.data_filter import compile_filter
from tidings.events.matching import QueryType

#: What each kind of name may be, ``*`` included, and how an error describes it.
_NAME_RULES = {
    "streams": (re.compile(r"^[A-Za-z0-9_.*-]{1,64}$"), "1-64 of A-Z, a-z, 0-9, _ . -"),
    "components": (re.compile(r"^[A-Za-z0-9_*]{1,32}$"), "1-16 of A-Z, a-z, 0-9 and _"),
    "types": (re.compile(r"^[A-Z_*]{1,32}$"), "1-16 of A-Z and _"),
}


class StreamGrant(StrictModel):
    """One entry of a stream user's ``allow`` list (see the module docstring)."""

    streams: list[str] = Field(
        min_length=1,
        description="The streams this grant is about: names, or patterns (``*``: any run).",
    )
    components: list[str] = Field(
        default_factory=lambda: ["*"],
        description=(
            "The consumer components the user may consume them as (``LIVE`` included: it is a "
            "name like the others); ``[]``: none (a grant for ``addEvent`` only)."
        ),
    )
    types: list[str] = Field(
        default_factory=lambda: ["*"],
        description="The FTN18 types the user may read there; ``[]``: none.",
    )
    add_event: list[str] = Field(
        default_factory=list,
        description="The FTN18 types the user may generate there with ``addEvent``.",
    )
    where: dict[str, Any] | None = Field(
        default=None,
        description=(
            "Only events whose data passes this filter: JSON Pointer -> condition (a JSON "
            "scalar to equal, ``{in: [...]}``, ``{not_in: [...]}``, ``{exists: bool}``); it "
            "holds for the events read and for those ``addEvent`` generates."
        ),
    )

    @field_validator("streams", "components", "types", "add_event")
    @classmethod
    def _names(cls, value: list[str], info: ValidationInfo) -> list[str]:
        field = info.field_name or "types"
        rule, shape = _NAME_RULES["types" if field == "add_event" else field]
        for name in value:
            if not rule.match(name):
                raise ValueError(
                    f"{name!r} is not a name or a pattern here ({shape}; * for any run)"
                )
        return value

    @field_validator("where")
    @classmethod
    def _where(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            try:
                compile_filter(value)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _grants_something(self) -> StreamGrant:
        if not (self.components and self.types) and not self.add_event:
            raise ValueError(
                "this grant allows nothing: give components and types to read, or add_event"
            )
        return self


@lru_cache(maxsize=1024)
def name_pattern(pattern: str) -> re.Pattern[str]:
    """A name pattern as a regular expression: ``*`` any run, everything else itself."""
    return re.compile("^" + ".*".join(re.escape(part) for part in pattern.split("*")) + "$")


def matching(patterns: Iterable[str], names: Iterable[str]) -> list[str]:
    """The ``names`` that one of ``patterns`` matches, in their order."""
    compiled = [name_pattern(p) for p in patterns]
    return [name for name in names if any(c.match(name) for c in compiled)]


def check_grants(
    users: Mapping[str, list[StreamGrant] | None],
    streams: Mapping[str, Mapping[str, tuple[QueryType, ...]]],
) -> None:
    """Refuse (ConfigError naming the key) a grant whose patterns match nothing: a stream
    pattern no stream matches, or a type pattern that matches no type of the streams the
    grant names (under ``add_event``: no type they can generate). ``streams``: each stream's
    FTN18 types and their patterns."""
    for user, grants in users.items():
        for index, grant in enumerate(grants or ()):
            where = f"stream_users.{user}.allow.{index}"
            named = []
            for pattern in grant.streams:
                found = matching([pattern], streams)
                if not found:
                    raise ConfigError(
                        f"{where}.streams: {pattern!r} matches no stream (the streams: "
                        f"{', '.join(streams) or 'none'})"
                    )
                named += found
            readable = {t for s in named for t in streams[s]}
            generable = {t for s in named for t, p in streams[s].items() if generated_type(p)}
            one = len(set(named)) == 1
            for key, patterns, types, what in (
                ("types", grant.types, readable, "carries" if one else "carry"),
                ("add_event", grant.add_event, generable, "can generate with addEvent"),
            ):
                for pattern in patterns:
                    if not matching([pattern], types):
                        raise ConfigError(
                            f"{where}.{key}: {pattern!r} matches no type that "
                            f"{_list(named)} {what} ({', '.join(sorted(types)) or 'none'})"
                        )


def _list(streams: list[str]) -> str:
    unique = list(dict.fromkeys(streams))
    return ("stream " if len(unique) == 1 else "streams ") + ", ".join(unique)
