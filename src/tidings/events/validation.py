"""The checks an event must pass before anything stores it, shared by every edge that takes one.

The store refuses what it could not keep faithfully; the engine sorts a module's bad events
out before a session is stored; the query model bounds its integers the same way. Keeping
the rules here, beside the model they describe, gives every edge the same rule and the same
message. Every refusal is a :class:`~tidings.errors.StoreError` naming the field.
"""

from __future__ import annotations

from tidings.errors import StoreError
from tidings.events.matching import ANY_ONE, ANY_REST
from tidings.events.model import EventId, EventType, NewEvent, PayloadKind, StoredEvent, encode_type

#: The range of every integer the store keeps (the databases' BIGINT).
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Reserved type segments: they are wildcards in queries and subscriptions (Hat).
WILDCARDS = frozenset({ANY_ONE, ANY_REST})
#: The longest type a registration may have, as the store keeps it (its
#: :func:`~tidings.events.model.encode_type` text), and the longest outbox id (UTF-8 bytes).
#: PostgreSQL refuses an index entry over 2,704 bytes, and the outbox key indexes both: a
#: longer one failed the whole transaction, so every registration grouped with it.
MAX_TYPE_TEXT = 2_000
MAX_OUTBOX_ID_BYTES = 500
#: The type prefix of the event servers' own consumer events (a stream consumer's position,
#: replicated between redundant servers): only the servers write them, so an edge taking
#: events from clients (the Eventer, the relay's targets) refuses it, or anyone able to
#: register an event could move any consumer past events it never read.
RESERVED_CONSUMER_TYPE: EventType = ("tidings", "stream", "consumer")


def reserved_type_problem(event_type: EventType) -> str | None:
    """Why a client may not register an event of ``event_type`` (it is under the reserved
    consumer prefix), or None."""
    if tuple(event_type[: len(RESERVED_CONSUMER_TYPE)]) != RESERVED_CONSUMER_TYPE:
        return None
    return (
        f"type {_shown(event_type)} is under the reserved prefix "
        f"{'/'.join(RESERVED_CONSUMER_TYPE)}: only the event servers write those events"
    )


def validate_new_event(new_event: object) -> str | None:
    """Why :meth:`EventStore.register` would refuse ``new_event``, or None if it takes it.

    For callers that sort out bad events before registering a batch (the engine drops a
    module's invalid event rather than failing the whole session); the message is the one
    ``register`` would raise, without the event's index.
    """
    try:
        check_new_event("", new_event)
    except StoreError as exc:
        return str(exc)
    return None


#: Types that passed every check of a new event's type (see :func:`check_new_event`), up to
#: :data:`_CHECKED_TYPES_MAX` of them: registrations repeat few types, so each is walked
#: and measured once rather than for every event (the engine checks every event it runs).
_CHECKED_TYPES: set[EventType] = set()
_CHECKED_TYPES_MAX = 65_536


def check_new_event(where: str, new_event: object) -> None:
    """Refuse ``new_event`` with a StoreError whose message starts with ``where``.

    A type that passed its checks before is not walked again (:data:`_CHECKED_TYPES`); the
    other fields are checked every time, and the checks run in the same order either way,
    so an event with several problems is refused for the same one."""
    if not isinstance(new_event, NewEvent):
        raise StoreError(f"{where}expected a NewEvent, got {type(new_event).__name__}")
    event_type = new_event.type
    try:
        known = event_type in _CHECKED_TYPES
    except TypeError:  # unhashable, so no valid type: the checks below say why
        known = False
    if not known:
        _check_type(where, event_type)
    _check_fields_but_type(
        where,
        new_event.payload,
        new_event.payload_kind,
        new_event.source_timestamp_us,
        new_event.outbox_event_id,
    )
    # Sizes for new events only, both backends alike (a store can move); events synced
    # from a peer are kept as the peer has them where the database can index them.
    if not known:
        if (problem := _type_size_problem(event_type)) is not None:
            raise StoreError(f"{where}{problem}")
        # Remembered only as plain str segments in a plain tuple: a subclass may compare
        # equal to a valid type and differ from it.
        if type(event_type) is tuple and all(type(segment) is str for segment in event_type):
            if len(_CHECKED_TYPES) >= _CHECKED_TYPES_MAX:
                _CHECKED_TYPES.clear()
            _CHECKED_TYPES.add(event_type)
    outbox_id = new_event.outbox_event_id
    if outbox_id is not None and (problem := _outbox_id_size_problem(outbox_id)) is not None:
        raise StoreError(f"{where}{problem}")


def size_problem(event_type: EventType, outbox_event_id: str | None) -> str | None:
    """Why an event's type or outbox id is too long for the stores' indexes, or None."""
    problem = _type_size_problem(event_type)
    if problem is not None or outbox_event_id is None:
        return problem
    return _outbox_id_size_problem(outbox_event_id)


def _type_size_problem(event_type: EventType) -> str | None:
    """Why a type is too long for the stores' indexes, or None."""
    # Its JSON text has at least each segment, two quotes and a separator each: a type over
    # the bound by that is refused before it is encoded (and cached).
    if sum(map(len, event_type)) + 3 * len(event_type) + 1 > MAX_TYPE_TEXT or (
        len(encode_type(event_type)) > MAX_TYPE_TEXT
    ):
        return (
            f"type {_shown(event_type)} is too long: over {MAX_TYPE_TEXT} characters "
            "as stored (JSON, non-ASCII escaped)"
        )
    return None


def _outbox_id_size_problem(outbox_event_id: str) -> str | None:
    """Why an outbox id is too long for the stores' indexes, or None."""
    if (
        len(outbox_event_id) > MAX_OUTBOX_ID_BYTES
        or len(outbox_event_id.encode(errors="surrogatepass")) > MAX_OUTBOX_ID_BYTES
    ):
        return f"outbox_event_id {outbox_event_id[:40]!r}... is over {MAX_OUTBOX_ID_BYTES} bytes"
    return None


def _shown(event_type: EventType) -> str:
    """A type in a message, cut short."""
    text = repr(event_type)
    return text if len(text) <= 80 else f"{text[:77]}..."


def validate_synced_event(synced: StoredEvent) -> str | None:
    """Why a syncer client must not store ``synced``, or None if it may.

    :meth:`EventStore.append_synced` refuses a whole batch for one such event, and a peer
    re-sends the same batch on every reconnect, so the syncer client sorts them out first
    and skips them. An outbox id (the tidings extension) is held to the limit that a new
    event's is held to on every backend, as no tidings server registers a longer one.
    """
    try:
        check_synced_event("", synced)
    except StoreError as exc:
        return str(exc)
    if synced.outbox_event_id is not None:
        return _outbox_id_size_problem(synced.outbox_event_id)
    return None


def check_synced_event(where: str, synced: object) -> None:
    """Refuse an event that came with its id and timestamp (from a peer server) unless the
    store can keep it as it is; the message starts with ``where``."""
    if not isinstance(synced, StoredEvent):
        raise StoreError(f"{where}expected a StoredEvent, got {type(synced).__name__}")
    if not isinstance(synced.id, EventId):
        raise StoreError(f"{where}id must be an EventId, not {synced.id!r}")
    # The ids Hat numbers from 1; 0 means "before the first" and is never stored.
    require_int(f"{where}id.server", synced.id.server, 1)
    require_int(f"{where}id.session", synced.id.session, 1)
    require_int(f"{where}id.instance", synced.id.instance, 1)
    require_int(f"{where}timestamp_us", synced.timestamp_us, INT64_MIN)
    _check_fields(
        where,
        synced.type,
        synced.payload,
        synced.payload_kind,
        synced.source_timestamp_us,
        synced.outbox_event_id,
    )


def require_int(name: str, value: object, minimum: int) -> None:
    """Refuse non-integers (bool included) and values outside ``minimum``..int64 max.

    Raises :class:`StoreError` naming ``name``: every integer the store keeps or compares
    in SQL must fit the databases' BIGINT.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise StoreError(f"{name} must be an int, not {value!r}")
    if not minimum <= value <= INT64_MAX:
        raise StoreError(f"{name} must be between {minimum} and {INT64_MAX}, not {value}")


def require_outbox_id(value: object, context: str = "") -> None:
    """An outbox id is a non-empty str that both databases can store (no NUL, valid UTF-8)."""
    if not isinstance(value, str) or not value:
        raise StoreError(f"{context}outbox_event_id must be a non-empty str, not {value!r}")
    if "\x00" in value or (not value.isascii() and not _encodable(value)):
        raise StoreError(f"{context}outbox_event_id {value!r} has a NUL or a lone surrogate")


def _check_fields(
    where: str,
    event_type: object,
    payload: object,
    kind: object,
    source_timestamp_us: object,
    outbox_event_id: object,
) -> None:
    """The checks shared by new and synced events."""
    _check_type(where, event_type)
    _check_fields_but_type(where, payload, kind, source_timestamp_us, outbox_event_id)


def _check_fields_but_type(
    where: str, payload: object, kind: object, source_timestamp_us: object, outbox_event_id: object
) -> None:
    """The shared checks after the type's."""
    _check_payload(where, payload, kind)
    if source_timestamp_us is not None:
        require_int(f"{where}source_timestamp_us", source_timestamp_us, INT64_MIN)
    if outbox_event_id is not None:
        require_outbox_id(outbox_event_id, where)


def _check_type(where: str, event_type: object) -> None:
    """A type is a non-empty tuple of strings without the query wildcards ``?`` and ``*``."""
    if not isinstance(event_type, tuple) or not event_type:
        raise StoreError(f"{where}type must be a non-empty tuple of str, not {event_type!r}")
    for segment in event_type:
        if not isinstance(segment, str):
            raise StoreError(f"{where}type {event_type!r} has a non-str segment {segment!r}")
        if segment in WILDCARDS:
            raise StoreError(
                f"{where}type {event_type!r} has segment {segment!r}, "
                "which is reserved as a query wildcard"
            )


def _check_payload(where: str, payload: object, kind: object) -> None:
    """A payload is bytes with its kind, or absent with no kind."""
    if payload is not None and not isinstance(payload, bytes):
        raise StoreError(f"{where}payload must be bytes, not {type(payload).__name__}")
    if kind is not None and not isinstance(kind, PayloadKind):
        raise StoreError(f"{where}payload_kind must be a PayloadKind, not {kind!r}")
    if (payload is None) != (kind is None):
        raise StoreError(f"{where}payload and payload_kind must be given together")


def _encodable(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True
