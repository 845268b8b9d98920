"""Who may subscribe to an intermediary, and to what: the ``subscribers:`` and ``anonymous:``
keys of an ``intermediary:`` section and of an ``intermediary_tiers:`` entry.

A subscriber is an identity with a token or a password (or both), kept as hashes only
(:mod:`.passwords`), and a grant: the event types (Hat patterns), the tables of SQL views and
the regions it may subscribe to. A grant lists what is allowed; what it leaves out is
refused, so a new subscriber sees nothing until it is given something. ``anonymous:`` says
whether a client without credentials is let in, from where (by default from loopback only,
so a deployment on one machine and the demo need no credentials) and with what grant (by
default everything: whoever is on the machine may see it all).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from tidings.config.model import AnonymousFrom, StrictModel, as_value_error
from tidings.config.passwords import PasswordHashConfig, check_token_hash, hash_from_env
from tidings.errors import StoreError
from tidings.events.matching import QueryType, validate_query_type

#: A subscriber's name: it travels in Basic credentials (no ``:``) and in messages.
_SUBSCRIBER_NAME = re.compile(r"[A-Za-z0-9_.@][A-Za-z0-9_.@-]{0,63}")
#: The name an anonymous client goes by in messages; no configured subscriber may take it.
ANONYMOUS = "anonymous"
#: Everything of a kind: the only pattern, table or region list that grants all.
EVERYTHING = "*"


def check_corners(lo: list[float], hi: list[float], names: tuple[str, str]) -> None:
    """ValueError unless ``lo`` and ``hi`` (keys ``names``) are the corners of a box: as many
    axes each, and finite ``lo < hi`` on every one."""
    if len(lo) != len(hi):
        raise ValueError(f"{names[0]} and {names[1]} must have the same number of axes")
    for axis, (a, b) in enumerate(zip(lo, hi, strict=True)):
        if not (math.isfinite(a) and math.isfinite(b) and a < b):
            raise ValueError(f"axis {axis} needs finite {names[0]} < {names[1]}")


class AllowedBox(StrictModel):
    """An axis-aligned box of the world a subscriber may subscribe regions inside."""

    lo: list[float] = Field(min_length=2, max_length=3, description="The lowest corner.")
    hi: list[float] = Field(
        min_length=2, max_length=3, description="The highest corner (as many numbers as lo)."
    )

    @model_validator(mode="after")
    def _a_box(self) -> AllowedBox:
        check_corners(self.lo, self.hi, ("lo", "hi"))
        return self


def _pattern(value: list[str]) -> list[str]:
    try:
        validate_query_type(tuple(value))
    except StoreError as exc:
        raise ValueError(str(exc)) from None
    return value


class SubscriberGrant(StrictModel):
    """What an identity may subscribe to; what is not listed is refused."""

    events: list[Annotated[list[str], Field(min_length=1)]] = Field(
        default_factory=list,
        description=(
            "Hat patterns (``[app, orders, '*']``; ``[['*']]``: every type): an event "
            "subscription is allowed when these cover each of its patterns. Row events "
            "(``rows.<table>``) are events too: a pattern covering them shows those rows."
        ),
    )
    tables: list[str] = Field(
        default_factory=list,
        description="Tables its SQL views may read (``['*']``: every configured table).",
    )
    regions: Literal["*"] | list[AllowedBox] = Field(
        default_factory=list,
        description=(
            "Boxes of the world its region subscriptions must lie inside (their union may "
            "hold one; ``'*'``: anywhere). A region relative to an entity moves with it, so "
            "only ``'*'`` allows one."
        ),
    )

    @field_validator("events")
    @classmethod
    def _patterns(cls, value: list[list[str]]) -> list[list[str]]:
        for pattern in value:
            _pattern(pattern)
        return value

    @field_validator("tables")
    @classmethod
    def _table_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if name != EVERYTHING and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"table {name!r}: a SQL name, or '*' for every table")
        return value

    def patterns(self) -> tuple[QueryType, ...]:
        """The event patterns as query types."""
        return tuple(tuple(pattern) for pattern in self.events)


class SubscriberConfig(PasswordHashConfig, SubscriberGrant):
    """A subscriber: how it proves who it is (a token, a password, or either), and its grant.
    A password goes with the subscriber's name as the user (HTTP Basic); a token alone
    names it (HTTP Bearer)."""

    token_hash: str | None = Field(
        default=None,
        description=(
            "The SHA-256 hash of its token, as ``tidings intermediary new-token`` prints it."
        ),
    )
    token_hash_env: str | None = Field(
        default=None,
        description="The environment variable holding that hash, read when the server starts.",
    )

    @model_validator(mode="after")
    def _credentials(self) -> SubscriberConfig:
        if self.token_hash is not None and self.token_hash_env is not None:
            raise ValueError("give one of token_hash and token_hash_env, not both")
        if self.token_hash is not None:
            as_value_error(check_token_hash, self.token_hash)
        if not self.has_password and not self.has_token:
            raise ValueError(
                "give a token (token_hash or token_hash_env) or a password "
                "(password_hash or password_hash_env)"
            )
        return self

    @property
    def has_token(self) -> bool:
        return self.token_hash is not None or self.token_hash_env is not None

    def token_digest_of(self, where: str) -> bytes | None:
        """The digest its token is looked up by (None: no token), read from the environment
        if configured so (at start-up); ``where`` names the entry in errors."""
        if self.token_hash_env is not None:
            value = hash_from_env(f"{where}.token_hash_env", self.token_hash_env, check_token_hash)
            return check_token_hash(value)
        return None if self.token_hash is None else check_token_hash(self.token_hash)


class AnonymousConfig(SubscriberGrant):
    """Clients that send no credentials: whether they are let in, and their grant."""

    allowed_from: AnonymousFrom = Field(
        default="loopback",
        description=(
            "``loopback``: only connections from this machine (127.0.0.0/8, ::1), as the "
            "Eventer's ``anonymous.allowed_from``; ``anywhere``; ``nowhere``: every client "
            "authenticates. Behind a proxy on the same machine every client comes from "
            "loopback: set ``nowhere`` there."
        ),
    )
    events: list[Annotated[list[str], Field(min_length=1)]] = Field(
        default_factory=lambda: [[EVERYTHING]],
        description="Hat patterns an anonymous client may subscribe to (default: every type).",
    )
    tables: list[str] = Field(
        default_factory=lambda: [EVERYTHING],
        description="Tables its SQL views may read (default: every table).",
    )
    regions: Literal["*"] | list[AllowedBox] = Field(
        default="*", description="Boxes its regions must lie inside (default: anywhere)."
    )


class SubscriberAccess(StrictModel):
    """The keys a served intermediary (or tier) shares to decide who may subscribe."""

    subscribers: dict[str, SubscriberConfig] = Field(
        default_factory=dict,
        description="The subscribers by name, each with its credentials and grant.",
    )
    anonymous: AnonymousConfig = Field(
        default=AnonymousConfig(),
        description="Clients without credentials (default: from loopback only, granted all).",
    )

    @field_validator("subscribers")
    @classmethod
    def _names(cls, value: dict[str, SubscriberConfig]) -> dict[str, SubscriberConfig]:
        for name in value:
            if not _SUBSCRIBER_NAME.fullmatch(name) or name == ANONYMOUS:
                raise ValueError(
                    f"subscriber name {name!r}: 1-64 of letters, digits, _ . @ - (not first), "
                    f"and not {ANONYMOUS!r}"
                )
        return value

    def check_tables(self, tables: list[str]) -> None:
        """Refuse a grant naming a table that is not among ``tables`` (a typo would grant
        nothing, silently)."""
        known = {name.lower() for name in tables}
        named = [("anonymous", self.anonymous)] + [
            (f"subscribers.{name}", entry) for name, entry in self.subscribers.items()
        ]
        for where, grant in named:
            for table in grant.tables:
                if table != EVERYTHING and table.lower() not in known:
                    raise ValueError(
                        f"{where}.tables: {table!r} is not a table of this intermediary "
                        f"({', '.join(tables) or 'it has none'})"
                    )
