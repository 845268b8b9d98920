"""Who may use the Eventer, and for what: ``eventer_server.anonymous`` and
``eventer_server.identities`` of the event server's file.

A client has an identity when the server verified its certificate (mutual TLS: the
certificate's subject CN), or when it logged in with the tidings extension
``TidingsEventer.MsgLoginReq`` (a name and a password, checked against the name's
``password_hash``). Every other client is anonymous, which hat-event's own clients are
unless they present a certificate; whether anonymous clients are served depends on where
they connect from (``anonymous.allowed_from``, loopback by default).

Each identity, and the anonymous clients, are granted Hat patterns of the event types they
may register, query and subscribe to (default: everything, ``[["*"]]``). The server refuses
the rest by type (:mod:`tidings.server.eventer.access`). With ``identities`` listed, a
certificate naming another identity is refused; without, any certificate the CA signed is
granted everything.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from tidings.config.model import AnonymousFrom, StrictModel
from tidings.config.passwords import check_hash
from tidings.errors import ConfigError, StoreError
from tidings.events.matching import QueryType, validate_query_type

#: The grant of everything: the pattern every event type matches.
EVERYTHING: tuple[QueryType, ...] = (("*",),)


def _everything() -> list[list[str]]:
    return [list(pattern) for pattern in EVERYTHING]


class EventerGrantsConfig(StrictModel):
    """The event types a client may register, query and subscribe to, as Hat patterns
    (``?`` one segment, a final ``*`` any number)."""

    may_register: list[list[str]] = Field(
        default_factory=_everything,
        description=(
            "Patterns of the event types it may register; another type's event fails alone "
            "(``MsgRegisterRes`` holds no event for it). ``[]``: none."
        ),
    )
    may_query: list[list[str]] = Field(
        default_factory=_everything,
        description=(
            "Patterns of the event types it may query; a query is narrowed to them (the part "
            "outside is refused and logged, never answered). ``[]``: none."
        ),
    )
    may_subscribe: list[list[str]] = Field(
        default_factory=_everything,
        description=(
            "Patterns of the event types it may subscribe to; a subscription is narrowed to "
            "them, as a query is. ``[]``: none."
        ),
    )

    @field_validator("may_register", "may_query", "may_subscribe", mode="before")
    @classmethod
    def _patterns(cls, value: object) -> object:
        if not isinstance(value, list | tuple):
            return value  # pydantic says what it expected
        for pattern in value:
            candidate = tuple(pattern) if isinstance(pattern, list | tuple) else pattern
            try:
                validate_query_type(candidate)
            except StoreError as exc:
                raise ValueError(f"{pattern!r} is not an event type pattern: {exc}") from None
        return value

    def patterns(self, kind: Literal["register", "query", "subscribe"]) -> tuple[QueryType, ...]:
        """The patterns granted for one kind of request, as query types."""
        granted: list[list[str]] = getattr(self, f"may_{kind}")
        return tuple(tuple(pattern) for pattern in granted)


class EventerIdentityConfig(EventerGrantsConfig):
    """One identity: what it is granted, and the hash of its password if it may log in."""

    password_hash: str | None = Field(
        default=None,
        description=(
            "The identity may also log in with this password (the tidings extension "
            "``TidingsEventer.MsgLoginReq``; only over TLS or on loopback): its hash, as "
            "``tidings streams hash-password`` prints it. Absent: only its certificate names it."
        ),
    )

    @field_validator("password_hash")
    @classmethod
    def _hash(cls, value: str | None) -> str | None:
        try:
            return None if value is None else check_hash(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


class EventerAnonymousConfig(EventerGrantsConfig):
    """Clients without an identity: where they may connect from, and what they may do."""

    allowed_from: AnonymousFrom = Field(
        default="loopback",
        description=(
            "``loopback``: served when they connect from this host (127.0.0.0/8, ::1); "
            "``anywhere``: from any address (as hat-event serves everyone); ``nowhere``: every "
            "client needs an identity. A refused client is disconnected before it is served, "
            "unless it logs in first."
        ),
    )
