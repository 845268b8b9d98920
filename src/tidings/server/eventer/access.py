"""Who an Eventer client is, and which event types it may register, query and subscribe to.

**Identity.** A client whose certificate the server verified (mutual TLS) is the
certificate's subject CN. A client without one may log in with the tidings extension
``TidingsEventer.MsgLoginReq`` (a name of ``eventer_server.identities`` and its password),
as its first message, over TLS or from the loopback (a password never crosses the network
in clear). Any other client is anonymous, served only where ``anonymous.allowed_from``
admits its address (the loopback by default); elsewhere its connection is closed unless
its first message logs it in. hat-event's own clients never log in: over the network they
need a certificate, or ``allowed_from: anywhere``.

**Authorisation.** Each identity, and the anonymous clients, are granted Hat patterns per
request kind (:mod:`tidings.config.eventer_access`). hat-event 0.8.5's protocol has no
error replies, so a refusal takes the form its clients already handle, and the connection
goes on for what is allowed:

- *register*: an event of a type outside the grant fails alone, as an event the store
  cannot keep does (no event in its place in ``MsgRegisterRes``);
- *query* and *subscribe*: the requested types are narrowed to the grant (a request for
  ``*`` by a client granted ``orders/*`` gets ``orders/*``), and a request with nothing
  left is answered with no events (a subscription to nothing).

Every refusal is logged naming the identity and the refused type (once per connection and
type, so a client repeating itself does not flood the log) and counted in the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from tidings.address import is_loopback
from tidings.config.eventer_access import (
    EVERYTHING,
    EventerAnonymousConfig,
    EventerGrantsConfig,
    EventerIdentityConfig,
)
from tidings.config.passwords import password_matches
from tidings.errors import ConnectionClosed
from tidings.events.matching import QueryType, TypeMatcher, narrow
from tidings.events.model import EventType
from tidings.events.query import QueryData
from tidings.server.eventer.counters import EventerCounters
from tidings.wire import codec
from tidings.wire.chatter import Connection, Message

log = logging.getLogger(__name__)

#: Password checks (scrypt, ~50 ms of a core each) running at once, at most: a flood of
#: logins queues here instead of taking every core.
_CONCURRENT_CHECKS = 2


class Grants:
    """What a client may do: the patterns of each request kind, and a matcher for the
    register check (made once per identity, when the server starts)."""

    __slots__ = ("_register_matcher", "query", "register", "subscribe")

    def __init__(self, config: EventerGrantsConfig) -> None:
        self.register = config.patterns("register")
        self.query = config.patterns("query")
        self.subscribe = config.patterns("subscribe")
        self._register_matcher = None if self.register == EVERYTHING else TypeMatcher(self.register)

    def may_register(self, event_type: EventType) -> bool:
        return self._register_matcher is None or self._register_matcher.matches(event_type)

    def may_query(self, event_type: EventType) -> bool:
        """Whether the exact type ``event_type`` may be queried."""
        kept, _ = narrow([event_type], self.query)
        return bool(kept)

    @staticmethod
    def narrowed(
        requested: Sequence[QueryType], granted: Sequence[QueryType]
    ) -> tuple[list[QueryType], list[QueryType]]:
        """``requested`` within ``granted``, and the requested types refused in part or whole
        (:func:`tidings.events.matching.narrow`)."""
        if tuple(granted) == EVERYTHING:
            return list(requested), []
        return narrow(requested, granted)


#: The grants of a client nothing restricts.
ALL = Grants(EventerGrantsConfig())


@dataclass(frozen=True)
class Admission:
    """Who a connection's client is and what it may do; ``grants`` None: it may do nothing
    until it logs in (an anonymous client where anonymous ones are not served)."""

    identity: str | None
    grants: Grants | None
    #: Why the client may not be served anonymously (when ``grants`` is None).
    anonymous_refused: str = ""

    def describe(self, connection: Connection) -> str:
        """The client as logs name it."""
        if self.identity is None:
            return f"anonymous client {connection.peer}"
        return f"identity {self.identity!r} ({connection.peer})"


class EventerAccess:
    """The Eventer's policy: the anonymous clients' place and grants, and the identities."""

    def __init__(
        self,
        anonymous: EventerAnonymousConfig | None = None,
        identities: Mapping[str, EventerIdentityConfig] | None = None,
    ) -> None:
        self._anonymous = anonymous or EventerAnonymousConfig()
        self._anonymous_grants = Grants(self._anonymous)
        self._identities = dict(identities or {})
        self._grants = {name: Grants(config) for name, config in self._identities.items()}
        self._checks = asyncio.Semaphore(_CONCURRENT_CHECKS)

    def admit(self, connection: Connection) -> Admission | str:
        """The admission of a new connection, or why it is refused (a certificate naming an
        identity the server does not know)."""
        certified = connection.certificate_identity
        if certified is not None:
            if not self._identities:
                return Admission(certified, ALL)
            if certified not in self._identities:
                return f"certificate identity {certified!r} is not one of eventer_server.identities"
            return Admission(certified, self._grants[certified])
        where = self._anonymous.allowed_from
        if where == "anywhere" or (where == "loopback" and _loopback(connection)):
            return Admission(None, self._anonymous_grants)
        served = "nowhere" if where == "nowhere" else "on loopback only"
        return Admission(
            None,
            None,
            f"anonymous clients are served {served} (eventer_server.anonymous.allowed_from): "
            "present a client certificate or log in",
        )

    async def login(
        self, connection: Connection, identity: str, password: str
    ) -> tuple[Admission | None, str]:
        """Check a login: the admission it gives, or None and why it is refused."""
        if connection.certificate_identity is not None:
            return None, (
                f"already identified by its certificate as {connection.certificate_identity!r}"
            )
        if not connection.secure and not _loopback(connection):
            return None, "a password is taken only over TLS (ssl+sbs://) or on loopback"
        config = self._identities.get(identity)
        stored = None if config is None else config.password_hash
        if stored is None or not await self._matches(password, stored):
            # Not saying which of the two is wrong: a guesser learns no names.
            return None, f"unknown identity {identity!r} or wrong password"
        return Admission(identity, self._grants[identity]), f"logged in as {identity!r}"

    async def answer_login(self, connection: Connection, message: Message) -> Admission | None:
        """Check a ``TidingsEventer.MsgLoginReq`` and answer it (``MsgLoginRes``); the
        admission it gives, or None (logged) if refused."""
        data = message.data if isinstance(message.data, dict) else {}
        identity = str(data.get("identity", ""))
        admission, said = await self.login(connection, identity, str(data.get("password", "")))
        if admission is None:
            log.warning(
                "eventer: login of %s as %r refused: %s",
                connection.peer,
                identity,
                said,
                extra={"peer": connection.peer, "identity": identity},
            )
        reply = {"success": admission is not None, "message": said}
        with contextlib.suppress(ConnectionClosed):
            connection.send(
                codec.TIDINGS_EVENTER, "MsgLoginRes", reply, conversation=message.conversation
            )
        return admission

    async def await_login(
        self, connection: Connection, why: str, timeout: float
    ) -> Admission | None:
        """The admission of a client that may not be served anonymously: its first message
        must log it in, within ``timeout`` seconds; else (and if the login is refused) the
        connection is closed saying ``why``."""
        try:
            async with asyncio.timeout(timeout):
                message = await connection.receive()
        except TimeoutError:
            connection.close(f"{why}; no login within {timeout:g} s")
            return None
        if (message.module, message.type) != (codec.TIDINGS_EVENTER, "MsgLoginReq"):
            connection.close(why)
            return None
        admission = await self.answer_login(connection, message)
        if admission is None:
            connection.close()  # logged; a clean close lets the refusal reach the client
        return admission

    async def _matches(self, password: str, stored: str) -> bool:
        async with self._checks:
            return await asyncio.to_thread(password_matches, password, stored)


def _loopback(connection: Connection) -> bool:
    return is_loopback(connection.peer_host)


def shown(types: Iterable[QueryType]) -> str:
    """Types as a refusal names them: ``a/b, c/*``."""
    return ", ".join("/".join(t) or "(empty)" for t in types)


class ClientAccess:
    """One connection's admission, applied to its requests; logs each refusal once per
    connection and kind and type, and counts every one."""

    __slots__ = ("_counters", "_logged", "admission", "connection", "fresh")

    def __init__(
        self, connection: Connection, admission: Admission, counters: EventerCounters
    ) -> None:
        self.connection = connection
        self.admission = admission
        #: No request served yet: a login may still change who the client is.
        self.fresh = True
        self._counters = counters
        self._logged: set[tuple[str, QueryType]] = set()

    @property
    def grants(self) -> Grants:
        assert self.admission.grants is not None  # a connection is served once admitted
        return self.admission.grants

    @property
    def who(self) -> str:
        return self.admission.describe(self.connection)

    def refused_events(self, types: Sequence[EventType]) -> None:
        """Events of a register request refused for their types."""
        self._counters.refused_events += len(types)
        self._log("register", dict.fromkeys(types), f"{len(types)} event(s) not registered")

    def narrow_query(self, query: QueryData) -> QueryData | None:
        """``query`` within the grant (None: nothing of it is granted)."""
        if query.matches_nothing():  # asks for nothing (a barrier): nothing to refuse
            return query
        requested = query.event_types if query.event_types is not None else EVERYTHING
        kept, refused = Grants.narrowed(requested, self.grants.query)
        if refused:
            self._counters.refused_queries += 1
            self._log("query", refused, "answered with the granted types only")
        if not kept:
            return None
        return query if not refused else replace(query, event_types=tuple(kept))

    def may_query(self, event_type: EventType) -> bool:
        """Whether one exact type may be queried (logged and counted if not)."""
        if self.grants.may_query(event_type):
            return True
        self._counters.refused_queries += 1
        self._log("query", [event_type], "answered with no events")
        return False

    def narrow_subscription(self, types: Sequence[QueryType]) -> list[QueryType]:
        kept, refused = Grants.narrowed(types, self.grants.subscribe)
        if refused:
            self._counters.refused_subscriptions += 1
            self._log("subscribe to", refused, "subscribed to the granted types only")
        return kept

    def _log(self, kind: str, types: Iterable[QueryType], outcome: str) -> None:
        new = [t for t in types if (kind, t) not in self._logged]
        if not new:
            return
        self._logged.update((kind, t) for t in new)
        log.warning(
            "eventer: %s may not %s %s: refused, %s",
            self.who,
            kind,
            shown(new),
            outcome,
            extra={
                "peer": self.connection.peer,
                "identity": self.admission.identity,
                "refused": kind,
                "types": [list(t) for t in new],
            },
        )
