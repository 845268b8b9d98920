"""SBS encoding of hat-event 0.8.5 messages and their mapping to the one event model.

The schemas ship as ``.sbs`` text beside this module (our transcription of the 0.8.5
protocol) and are compiled once by ``hat-sbs``, the maintained SBS implementation. Values
cross the codec as hat-sbs gives them (records as dicts, choices as ``(name, value)``); the
functions below turn them into :mod:`tidings.events` objects and back, checking every
field, so that nothing a peer sends reaches the engine unchecked.

Every value the ``*_from_sbs`` functions take comes out of the SBS decoder, which already
guarantees its shape (records are dicts with every field, choices ``(name, value)`` pairs,
strings ``str``, integers ``int``); they check only what the schema cannot say (the
microsecond range, that a JSON payload is JSON), because this conversion runs for every
event a client registers.

Timestamps on the wire are ``{s, us}``; the store keeps integer microseconds. A JSON
payload is a JSON text on the wire and is stored as its UTF-8 bytes unchanged; an SBS
payload (``Hat.Data``) is stored as its SBS encoding and never interpreted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from importlib import resources
from typing import Any

from hat import sbs
from hat.sbs import evaluator, parser

from tidings.errors import ProtocolError
from tidings.events.model import EventId, EventType, NewEvent, PayloadKind, StoredEvent
from tidings.events.query import Order, OrderBy, QueryData
from tidings.wire import prescan

#: One hat-sbs value (dict, list, tuple, int, str, bytes, ...).
Value = Any

_US = 1_000_000
_JSON = json.JSONDecoder()


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number (JSON has no NaN or Infinity)")


#: What a registered payload must be: strict JSON (RFC 8259), as emit writes it. Python's
#: decoder accepts NaN and Infinity, which every other JSON reader of the event refuses.
_STRICT_JSON = json.JSONDecoder(parse_constant=_not_json)
_JSON_WS = re.compile(r"[ \t\n\r]*")


def _load_schemas() -> list[str]:
    schemas = resources.files("tidings.wire") / "schemas"
    return [path.read_text() for path in schemas.iterdir() if path.name.endswith(".sbs")]


_SCHEMA_TEXTS = _load_schemas()
REPOSITORY = sbs.Repository(*_SCHEMA_TEXTS)
#: The same schemas as scanners, which bound every decode (see :mod:`tidings.wire.prescan`).
SCHEMAS = prescan.Schemas(evaluator.evaluate_modules(parser.parse(t) for t in _SCHEMA_TEXTS))

#: The protocol modules, as messages name them on the wire: chatter's keep-alive,
#: hat-event's client protocol and its servers' sync, and tidings' extensions of both.
PING = "HatPing"
EVENTER = "HatEventer"
SYNCER = "HatSyncer"
TIDINGS_EVENTER = "TidingsEventer"
TIDINGS_SYNCER = "TidingsSyncer"

#: The message types each protocol module defines; anything else is a protocol error.
MESSAGE_TYPES: dict[str, frozenset[str]] = {
    PING: frozenset({"MsgPing", "MsgPong"}),
    EVENTER: frozenset(
        {
            "MsgSubscribe",
            "MsgNotify",
            "MsgRegisterReq",
            "MsgRegisterRes",
            "MsgQueryReq",
            "MsgQueryRes",
        }
    ),
    SYNCER: frozenset({"MsgReq", "MsgSynced", "MsgEvents", "MsgFlushReq", "MsgFlushRes"}),
    TIDINGS_EVENTER: frozenset(
        {"MsgRegisterReq", "MsgLatestByKeyReq", "MsgLoginReq", "MsgLoginRes"}
    ),
    TIDINGS_SYNCER: frozenset({"MsgEvents"}),
}


def encode(module: str | None, type_name: str, value: Value) -> bytes:
    """Encode ``value`` as ``module.type_name``."""
    encoded: bytes = REPOSITORY.encode(module, type_name, value)
    return encoded


def value_budget(size: int, *, from_server: bool = False) -> int:
    """How many values a message of ``size`` bytes may decode into.

    What a server reads (``from_server`` false) is held to :func:`prescan.value_budget`:
    anyone who can connect sends it, of any type it likes. What a client reads from the
    server it chose has no budget beyond its bytes: it is as large as the client asked for
    (a query's reply, the events of a subscription or of a sync), and dense when events are
    small: a payload-less event is 13 values in 21 bytes, and a budget there made tidings'
    own clients and Syncer peers close on what its server had stored."""
    return prescan.UNBOUNDED if from_server else prescan.value_budget(size)


def decode(
    module: str | None,
    type_name: str,
    data: bytes | bytearray | memoryview,
    *,
    from_server: bool = False,
) -> Value:
    """Decode ``data`` as ``module.type_name``; bad bytes raise :class:`ProtocolError`.

    The pre-scan (:mod:`tidings.wire.prescan`) refuses lying counts and messages over
    their budget of values (:func:`value_budget`) before the decoder allocates anything.
    """
    SCHEMAS.check(module, type_name, data, value_budget(len(data), from_server=from_server))
    return _decode(module, type_name, data)


def decode_in_slices(
    module: str | None,
    type_name: str,
    data: bytes | bytearray | memoryview,
    slice_bytes: int,
    *,
    from_server: bool = False,
) -> Value:
    """:func:`decode` for large messages, in a thread: a top-level array is decoded a run
    of about ``slice_bytes`` at a time, so the C decoder (which holds the GIL) leaves the
    event loop a turn between runs. Other types decode at once."""
    budget = value_budget(len(data), from_server=from_server)
    slices = SCHEMAS.check(module, type_name, data, budget, slice_bytes)
    if slices is None:
        return _decode(module, type_name, data)
    view = memoryview(data)
    items: list[Value] = []
    for part in slices:
        run = encode_integer(part.count) + view[part.start : part.end]
        items += _decode(module, type_name, run)
    return items


def encode_integer(value: int) -> bytes:
    """The SBS encoding of an integer (an array's count, a byte string's length, a frame
    head's fields): 7 bits a byte, most significant first, two's complement, the last byte
    marked by its top bit (what ``REPOSITORY.encode(None, "Integer", value)`` gives, at a
    fraction of its cost: every frame sent needs three, every event sent six)."""
    if 0 <= value < 64:
        return _SMALL_INTEGERS[value]
    if 0 <= value < 8192:  # two bytes, the first's sign bit clear
        return bytes((value >> 7, (value & 0x7F) | 0x80))
    if 0 <= value < 1 << 20:  # three bytes (instance numbers, positions)
        return bytes((value >> 14, (value >> 7) & 0x7F, (value & 0x7F) | 0x80))
    groups = [(value & 0x7F) | 0x80]
    while value >> 6 not in (0, -1):  # the sign bit of the groups so far is not yet right
        value >>= 7
        groups.append(value & 0x7F)
    return bytes(reversed(groups))


_SMALL_INTEGERS = tuple(bytes((0x80 | value,)) for value in range(64))


def _decode(module: str | None, type_name: str, data: bytes | bytearray | memoryview) -> Value:
    """hat-sbs's C decoder reports the malformed input the pre-scan lets through (bad
    UTF-8, say) as SystemError or UnicodeDecodeError; all of it means the same to us."""
    try:
        return REPOSITORY.decode(module, type_name, data)
    except Exception as exc:
        raise ProtocolError(
            f"{module}.{type_name}: undecodable SBS ({type(exc).__name__})"
        ) from exc


# --- timestamps -----------------------------------------------------------------------------


def timestamp_to_sbs(us: int) -> dict[str, int]:
    seconds, micros = divmod(us, _US)
    return {"s": seconds, "us": micros}


def timestamp_from_sbs(value: Value, field: str) -> int:
    us = value["us"]
    if not 0 <= us < _US:
        raise ProtocolError(f"{field}: invalid timestamp {value!r}")
    us_since_epoch: int = value["s"] * _US + us
    return us_since_epoch


def _optional_timestamp_to_sbs(us: int | None) -> tuple[str, Value]:
    return ("none", None) if us is None else ("value", timestamp_to_sbs(us))


def _optional_timestamp_from_sbs(value: Value, field: str) -> int | None:
    return None if value[0] == "none" else timestamp_from_sbs(value[1], field)


# --- payloads -------------------------------------------------------------------------------


def payload_to_sbs(kind: PayloadKind, data: bytes) -> tuple[str, Value]:
    """The ``EventPayload`` choice of a stored payload."""
    if kind is PayloadKind.BINARY:
        return ("binary", data)
    if kind is PayloadKind.JSON:
        return ("json", data.decode())
    return ("sbs", REPOSITORY.decode("Hat", "Data", data))


def payload_from_sbs(
    value: Value, field: str, *, strict: bool = False
) -> tuple[PayloadKind, bytes]:
    """A wire ``EventPayload`` as the store keeps it; a JSON text must parse as JSON, and
    with ``strict`` (events being registered) hold no NaN or Infinity. Events already stored
    (from a peer, in a reply) are taken as Python's reader takes them, so an event a server
    kept once does not close every link that carries it later."""
    name, inner = value
    if name == "binary":
        return PayloadKind.BINARY, bytes(inner)
    if name == "json":
        try:
            _parse_json(inner, _STRICT_JSON if strict else _JSON)
        except ValueError as exc:
            raise ProtocolError(f"{field}: json payload is not valid JSON: {exc}") from exc
        except RecursionError:  # deeper than the interpreter's stack: a few KB of [[[[ do it
            # A new event is refused; one a server stored already (parsed there at a
            # shallower stack) passes unchecked, as its origin took it.
            if strict:
                raise ProtocolError(f"{field}: json payload is nested too deeply") from None
        return PayloadKind.JSON, inner.encode()
    if name == "sbs":
        return PayloadKind.SBS, encode("Hat", "Data", inner)
    raise ProtocolError(f"{field}: unknown payload kind {name!r}")


def _optional_payload_to_sbs(kind: PayloadKind | None, data: bytes | None) -> tuple[str, Value]:
    if kind is None or data is None:
        return ("none", None)
    return ("value", payload_to_sbs(kind, data))


def _optional_payload_from_sbs(
    value: Value, field: str, *, strict: bool = False
) -> tuple[PayloadKind, bytes] | tuple[None, None]:
    if value[0] == "none":
        return (None, None)
    return payload_from_sbs(value[1], field, strict=strict)


# --- ids and types --------------------------------------------------------------------------


def event_id_to_sbs(event_id: EventId) -> dict[str, int]:
    return {"server": event_id.server, "session": event_id.session, "instance": event_id.instance}


def event_id_from_sbs(value: Value) -> EventId:
    return EventId(value["server"], value["session"], value["instance"])


# --- events ---------------------------------------------------------------------------------


def encode_event(event: StoredEvent) -> bytes:
    """The SBS ``HatEventer.Event`` of a stored event, written field by field: at half the
    cost of building hat-sbs's value (dicts and tuples) for its C encoder, and every reply,
    notification and sync message is made of these. The tests hold it byte for byte equal
    to hat-sbs's encoding."""
    parts: list[bytes] = []
    _add_events(parts, (event,), marked=False)
    return b"".join(parts)


def _add_tail(parts: list[bytes], event: StoredEvent) -> None:
    """Add the fields of an ``Event`` after its timestamp: the source timestamp and the
    payload."""
    source = event.source_timestamp_us
    if source is None:
        parts.append(_NONE)
    else:
        seconds, micros = divmod(source, _US)
        parts += (_VALUE, encode_integer(seconds), encode_integer(micros))
    kind, payload = event.payload_kind, event.payload
    if kind is None or payload is None:
        parts.append(_NONE)
    elif kind is PayloadKind.SBS:
        # Stored as its Hat.Data encoding, but anything may have stored bytes that are not
        # exactly one (an engine module, the Python API): decoded and encoded again, so
        # that the message is sound or not sent (ProtocolError).
        parts += (_PAYLOAD_KINDS[kind], encode("Hat", "Data", _decode("Hat", "Data", payload)))
    else:
        if kind is PayloadKind.JSON and not bytes(payload).isascii():
            bytes(payload).decode()  # a String must be UTF-8 (as it is when it was stored)
        parts += (_PAYLOAD_KINDS[kind], encode_integer(len(payload)), payload)


def _add_events(parts: list[bytes], events: Iterable[StoredEvent | None], marked: bool) -> None:
    """Add the encodings of ``events`` (:func:`encode_event`'s), each after its
    ``MsgRegisterRes`` choice index if ``marked`` (None: a failure).

    The events of one session share its server, session number and timestamp: their
    bytes (the costliest integers of an event) are made once per run of such events, not
    once per event."""
    server: int | None = None
    session: int | None = None
    timestamp: int | None = None
    head = stamp = b""
    for event in events:
        if event is None:
            parts.append(_FAILURE)
            continue
        event_id = event.id
        if event_id.session != session or event_id.server != server:
            server, session = event_id.server, event_id.session
            head = encode_integer(server) + encode_integer(session)
            if marked:
                head = _EVENT + head
        if event.timestamp_us != timestamp:
            timestamp = event.timestamp_us
            seconds, micros = divmod(timestamp, _US)
            stamp = encode_integer(seconds) + encode_integer(micros)
        parts += (head, encode_integer(event_id.instance), _encoded_type(event.type), stamp)
        _add_tail(parts, event)


def encode_events(events: Sequence[StoredEvent]) -> bytes:
    """An ``Array(Event)``: ``HatEventer.MsgNotify``, ``MsgQueryRes``, ``HatSyncer.MsgEvents``."""
    parts = [encode_integer(len(events))]
    _add_events(parts, events, marked=False)
    return b"".join(parts)


@lru_cache(maxsize=4096)
def _encoded_type(event_type: EventType) -> bytes:
    """An ``EventType`` (an Array of Strings); kept, since batches repeat few types."""
    segments = [segment.encode() for segment in event_type]
    return b"".join(
        [encode_integer(len(segments)), *(encode_integer(len(s)) + s for s in segments)]
    )


#: An Optional's choice indexes, and those of ``Optional(EventPayload)``'s value's kinds.
_NONE, _VALUE = b"\x80", b"\x81"
_PAYLOAD_KINDS = {
    PayloadKind.BINARY: _VALUE + b"\x80",
    PayloadKind.JSON: _VALUE + b"\x81",
    PayloadKind.SBS: _VALUE + b"\x82",
}


def event_from_sbs(value: Value, field: str = "event") -> StoredEvent:
    """A wire ``Event`` (from a peer server); ``position`` is 0, the local store sets it."""
    kind, data = _optional_payload_from_sbs(value["payload"], f"{field}.payload")
    return StoredEvent(
        position=0,
        id=event_id_from_sbs(value["id"]),
        type=tuple(value["type"]),
        timestamp_us=timestamp_from_sbs(value["timestamp"], f"{field}.timestamp"),
        source_timestamp_us=_optional_timestamp_from_sbs(
            value["sourceTimestamp"], f"{field}.sourceTimestamp"
        ),
        payload=data,
        payload_kind=kind,
        outbox_event_id=None,
    )


def register_event_to_sbs(event: NewEvent) -> dict[str, Value]:
    """The wire ``RegisterEvent`` of a new event (the outbox id travels separately)."""
    return {
        "type": list(event.type),
        "sourceTimestamp": _optional_timestamp_to_sbs(event.source_timestamp_us),
        "payload": _optional_payload_to_sbs(event.payload_kind, event.payload),
    }


def register_event_from_sbs(
    value: Value, field: str = "event", outbox_event_id: str | None = None
) -> NewEvent:
    """A wire ``RegisterEvent``; its type is checked later by the engine, which fails that
    event alone if it holds a wildcard. A JSON payload must be strict JSON (no NaN or
    Infinity), as emit refuses them: the event fails alone."""
    kind, data = _optional_payload_from_sbs(value["payload"], f"{field}.payload", strict=True)
    source = value["sourceTimestamp"]
    return NewEvent(
        type=tuple(value["type"]),
        payload=data,
        payload_kind=kind,
        source_timestamp_us=None
        if source[0] == "none"
        else timestamp_from_sbs(source[1], f"{field}.sourceTimestamp"),
        outbox_event_id=outbox_event_id,
    )


def encode_register_results(results: Sequence[StoredEvent | None]) -> bytes:
    """``HatEventer.MsgRegisterRes``: each result its choice's index, then its event."""
    parts = [encode_integer(len(results))]
    _add_events(parts, results, marked=True)
    return b"".join(parts)


_EVENT, _FAILURE = b"\x80", b"\x81"  # the indexes of MsgRegisterRes's choice


def register_results_from_sbs(value: Value) -> list[StoredEvent | None]:
    return [
        event_from_sbs(inner, f"result {index}") if name == "event" else None
        for index, (name, inner) in enumerate(value)
    ]


def events_from_sbs(value: Value, field: str) -> list[StoredEvent]:
    return [event_from_sbs(item, f"{field}[{index}]") for index, item in enumerate(value)]


# --- queries --------------------------------------------------------------------------------

_ORDERS: dict[str, Order] = {"descending": "descending", "ascending": "ascending"}
_ORDER_BYS: dict[str, OrderBy] = {"timestamp": "timestamp", "sourceTimestamp": "source_timestamp"}


def query_to_sbs(query: QueryData) -> dict[str, Value]:
    def opt(value: Value) -> tuple[str, Value]:
        return ("none", None) if value is None else ("value", value)

    return {
        "serverId": opt(query.server_id),
        "ids": opt(
            None if query.event_ids is None else [event_id_to_sbs(i) for i in query.event_ids]
        ),
        "types": opt(None if query.event_types is None else [list(t) for t in query.event_types]),
        "tFrom": _optional_timestamp_to_sbs(query.t_from),
        "tTo": _optional_timestamp_to_sbs(query.t_to),
        "sourceTFrom": _optional_timestamp_to_sbs(query.source_t_from),
        "sourceTTo": _optional_timestamp_to_sbs(query.source_t_to),
        "payload": ("none", None)
        if query.payload is None
        else ("value", payload_to_sbs(*query.payload)),
        "order": (query.order, None),
        "orderBy": (
            "timestamp" if query.order_by == "timestamp" else "sourceTimestamp",
            None,
        ),
        "uniqueType": query.unique_type,
        "maxResults": opt(query.max_results),
    }


def query_from_sbs(value: Value) -> QueryData:
    """A wire ``QueryData``; the query model then checks ranges and wildcards."""
    ids = _optional(value["ids"])
    types = _optional(value["types"])
    payload = _optional(value["payload"])
    return QueryData(
        server_id=_optional(value["serverId"]),
        event_ids=None if ids is None else tuple(event_id_from_sbs(i) for i in ids),
        event_types=None if types is None else tuple(tuple(t) for t in types),
        t_from=_optional_timestamp_from_sbs(value["tFrom"], "query.tFrom"),
        t_to=_optional_timestamp_from_sbs(value["tTo"], "query.tTo"),
        source_t_from=_optional_timestamp_from_sbs(value["sourceTFrom"], "query.sourceTFrom"),
        source_t_to=_optional_timestamp_from_sbs(value["sourceTTo"], "query.sourceTTo"),
        payload=None if payload is None else payload_from_sbs(payload, "query.payload"),
        order=_ORDERS[value["order"][0]],
        order_by=_ORDER_BYS[value["orderBy"][0]],
        unique_type=value["uniqueType"],
        max_results=_optional(value["maxResults"]),
    )


def latest_by_key_request_to_sbs(
    event_type: Sequence[str], last_event_id: EventId | None, max_bytes: int | None
) -> dict[str, Value]:
    """A ``TidingsEventer.MsgLatestByKeyReq``: the page after ``last_event_id`` (None: the
    first), of at most ``max_bytes`` of events (None: no bound)."""
    return {
        "type": list(event_type),
        "lastEventId": (
            ("none", None) if last_event_id is None else ("value", event_id_to_sbs(last_event_id))
        ),
        "maxBytes": ("none", None) if max_bytes is None else ("value", max_bytes),
    }


def latest_by_key_request_from_sbs(value: Value) -> tuple[EventType, EventId | None, int | None]:
    """The type, the last event id and the byte bound of a ``MsgLatestByKeyReq``."""
    last = _optional(value["lastEventId"])
    return (
        tuple(value["type"]),
        None if last is None else event_id_from_sbs(last),
        _optional(value["maxBytes"]),
    )


def _optional(value: Value) -> Value:
    return None if value[0] == "none" else value[1]


def _parse_json(text: str, decoder: json.JSONDecoder = _JSON) -> None:
    """Check that ``text`` is JSON (the decoder's C scanner, without the wrapper layers)."""
    # The pattern matches the empty string: match() never gives None.
    leading = _JSON_WS.match(text, 0)
    assert leading is not None
    trailing = _JSON_WS.match(text, decoder.raw_decode(text, leading.end())[1])
    assert trailing is not None
    end = trailing.end()
    if end != len(text):
        raise ValueError(f"extra data at character {end}")
