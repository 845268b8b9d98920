"""The exception hierarchy of tidings.

Every error tidings raises on purpose derives from :class:`TidingsError`, so a caller can
catch the whole family at one edge and still tell the kinds apart. They all live here, at the
bottom of the layers, so that any part can raise or catch any of them without importing the
part that usually raises it (the client catches store errors without loading the store).
"""

from __future__ import annotations


class TidingsError(Exception):
    """Base of every error raised by tidings."""


class ConfigError(TidingsError):
    """The configuration is invalid; the message names the offending key and value."""


class UsageError(TidingsError, ValueError):
    """A call got an argument it cannot use; the message names the argument and its value.

    It is also a :class:`ValueError`, what Python raises for such an argument, so a caller
    that catches that keeps working.
    """


class EmitError(TidingsError):
    """An event could not be emitted; the surrounding transaction must not commit."""


class TransactionDoomed(EmitError):
    """An emit failed earlier in this transaction, so it may only be rolled back.

    Raised by every later emit in that transaction and by its commit, whichever way the
    transaction was opened (Session, Connection, ``outbox.transaction()``); the message
    names the first failure. Catching the first :class:`EmitError` cannot save the
    transaction: a domain write must never commit without the events it emitted.
    """


class SchemaError(TidingsError):
    """The database schema is missing, newer than this library, or cannot be upgraded."""


class TargetError(TidingsError):
    """A target could not be reached or refused an event."""


class TargetUnavailable(TargetError):
    """The target cannot be reached now (or took none of the call): the target is down.

    No event is to blame: the relay charges no retry for it, notes the target as down
    (its circuit breaker) and lets the events wait until a probe finds the target back.
    Whatever of the call may have arrived is sent again then, which targets must accept
    as a duplicate (JetStream's ``Nats-Msg-Id``, the event store's outbox event id).
    """


class TargetCallFailed(TargetError):
    """A call failed as a whole after sending began (connection lost, batch refused).

    Any event of the call may be the cause, so the relay narrows the call down (splits it)
    until the event that fails alone is found; the others are published and not charged.
    ``confirmed`` says, per event of the call, which were confirmed before it failed (empty:
    none known).
    """

    def __init__(self, message: str, confirmed: list[bool] | None = None) -> None:
        super().__init__(message)
        self.confirmed = confirmed or []


class RelayError(TidingsError):
    """The relay pipeline could not start or run."""


class HousekeepingError(TidingsError):
    """An archive step failed (e.g. a staged chunk could not be moved in); nothing was lost:
    the next run settles the chunk by what the database says."""


class ProtocolError(TidingsError):
    """A peer sent bytes that are not a valid message of the protocol; the link is closed."""


class ConnectionClosed(TidingsError):
    """The connection is closed (by either side, or after a protocol error)."""


class ReplyTooLarge(TidingsError):
    """A reply was larger than the connection's ``max_frame_bytes``: it was read past and
    dropped, its request fails with this error (naming the size and the limit), and the
    connection stays open. Ask for less, in pages, or connect with a larger limit."""


class TlsError(TidingsError, OSError):
    """A TLS link cannot be made: a certificate, key or CA file cannot be loaded, or the
    handshake failed (the peer's certificate is not trusted or names another host, the peer
    required a certificate we have not, or it does not speak TLS). The message names the
    file or the address and says which.

    It is also an :class:`OSError`, what a failed connection raises, so a part that keeps
    reconnecting treats it as one: it logs why and tries again.
    """


class AccessDenied(TidingsError):
    """A server refused a client's identity or request; the message names the identity and
    what was refused."""


class RequestTimeout(TidingsError, TimeoutError):
    """A request got no reply within its timeout; the connection stays open.

    It is also the built-in :class:`TimeoutError`, what a request timing out raised before
    it had a type of its own, so code that catches that (or ``asyncio.wait_for``'s) keeps
    working while a caller can still catch the whole family as :class:`TidingsError`.
    """


class StoreError(TidingsError):
    """The event store refused the input or its database failed; the message says which."""


class StoreBusy(StoreError):
    """A write that was asked not to wait found the append lock held by another writer."""


class HatImportError(TidingsError):
    """A hat-event lmdb database cannot be read, or an import from it does not check out."""


class EngineError(TidingsError):
    """A processing session was aborted (nothing stored) or a module could not be used."""


class ModuleLoadError(EngineError):
    """A module path could not be imported, has no ``create``, or ``create`` failed."""


class ClientError(TidingsError):
    """The client refused a request before sending it; the message says why."""


class StreamError(TidingsError):
    """An FTN18 stream call failed; ``name`` is the FutoIn error name the peer sees.

    FutoIn errors travel as a name (``NotRegistered``, ``SecurityError``, …) and a text, so
    the stream server raises this with both, and the stream client raises it with what the
    server sent.
    """

    def __init__(self, name: str, description: str = "") -> None:
        super().__init__(f"{name}: {description}" if description else name)
        self.name = name
        self.description = description


class StreamRefused(StreamError, AccessDenied):
    """A stream refused an authenticated user what its permissions do not allow: FTN3's
    ``Unauthorized`` ("security policy on the executor side does not allow access"), as
    opposed to ``SecurityError``, a failed authentication; an :class:`AccessDenied` like
    every part's refusals. ``user`` and ``reason`` (which permission was missing:
    ``stream``, ``component``, ``type``, ``add_event`` or ``add_event_data``) are what the
    stream's metrics count the refusal under."""

    def __init__(self, user: str, reason: str, description: str) -> None:
        super().__init__("Unauthorized", description)
        self.user = user
        self.reason = reason


class IntermediaryError(TidingsError):
    """An intermediary refused a subscription or could not serve it; the message names the
    problem."""


class AccessRefused(IntermediaryError, AccessDenied):
    """A subscriber was refused at an intermediary's WebSocket handshake, before the upgrade:
    ``status`` is the HTTP status it got (401: no credentials where they are needed, or
    wrong ones; 429: its address failed to log in too often, and ``retry_after_s`` says for
    how long it is refused), and the message says why without repeating a secret."""

    def __init__(self, status: int, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s


class SubscriptionRefused(IntermediaryError, AccessDenied):
    """An intermediary refused a subscription its subscriber's grant does not allow (an
    event type, a table, a region); the message names the identity, what was refused and
    what the grant allows. The connection goes on serving the rest."""
