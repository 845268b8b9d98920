"""What both sides of the Syncer share: the status events (the protocol module, HatSyncer,
is :data:`tidings.wire.codec.SYNCER`).

Status events, as hat-event registers them (protocol notes §6, JSON payloads, made with
:func:`~tidings.events.model.json_event`):

- ``('event', 'syncer', 'server')``: the list of ``{"client_name", "synced"}`` of the
  connected clients, registered when the server starts (``[]``) and on every change (a
  client sent its MsgReq, was sent MsgSynced, disconnected).
- ``('event', 'syncer', 'client', <peer server id>, 'synced')``: ``false`` when a connection
  receives events before MsgSynced (we were behind and are catching up), ``true`` on
  MsgSynced; registered only when the value differs from the last one registered, so a
  reconnect that finds nothing new registers nothing.

The outbox-id extension. hat-event's ``MsgEvents`` has no room for the outbox event id that
an event came from, so without it a server that got outbox event E from the relay and
again from a peer would store it twice. Between tidings servers the events travel as
``TidingsSyncer.MsgEvents`` instead, each with its outbox id. The peers agree on it in the
only message a syncer client sends, ``HatSyncer.MsgReq``: a tidings client appends
:data:`OUTBOX_IDS_MARK` to its ``clientName``; a tidings server that reads the mark sends
the extended message to that client (and reports its name without the mark), and plain
``HatSyncer.MsgEvents`` to every other client. hat-event 0.8.5 on either side sees only
HatSyncer messages: as a server it takes the marked name for a name (its status event
shows it) and sends plain events, which a tidings client stores as it always has; as a
client it never sends the mark and is sent plain events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tidings.errors import ProtocolError
from tidings.events.model import EventId, EventType, StoredEvent
from tidings.events.validation import validate_synced_event
from tidings.wire import codec

#: Type of the event listing the syncer server's clients.
SERVER_STATUS_TYPE: EventType = ("event", "syncer", "server")


def client_status_type(peer_server_id: int) -> EventType:
    """Type of the event telling whether our client of ``peer_server_id`` is synced."""
    return ("event", "syncer", "client", str(peer_server_id), "synced")


#: What a tidings syncer client appends to its ``clientName`` to be sent the outbox ids.
OUTBOX_IDS_MARK = " +tidings-outbox-ids"


def mark_client_name(name: str) -> str:
    """``name`` as a client that wants ``TidingsSyncer.MsgEvents`` sends it."""
    return name + OUTBOX_IDS_MARK


def parse_client_name(sent: str) -> tuple[str, bool]:
    """The client's name without the mark, and whether it asked for the outbox ids."""
    if sent.endswith(OUTBOX_IDS_MARK):
        return sent[: -len(OUTBOX_IDS_MARK)], True
    return sent, False


def encode_outbox_events(events: Sequence[StoredEvent]) -> bytes:
    """``TidingsSyncer.MsgEvents``: each ``SyncedEvent`` is its ``HatEventer.Event``
    followed by its ``Optional(String)`` outbox id, written as :func:`codec.encode_event`
    writes events (the tests hold it equal to hat-sbs's encoding)."""
    parts = [codec.encode_integer(len(events))]
    for event in events:
        parts.append(codec.encode_event(event))
        outbox_id = event.outbox_event_id
        if outbox_id is None:
            parts.append(_NONE)
        else:
            raw = outbox_id.encode()
            parts += (_VALUE, codec.encode_integer(len(raw)), raw)
    return b"".join(parts)


#: An Optional's choice indexes.
_NONE, _VALUE = b"\x80", b"\x81"


def outbox_events_from_sbs(value: codec.Value) -> list[StoredEvent]:
    """The events of a decoded ``TidingsSyncer.MsgEvents``, with their outbox ids."""
    return [_synced_event(item, True, f"MsgEvents[{i}]") for i, item in enumerate(value)]


def sort_synced_events(
    module: str, value: codec.Value
) -> tuple[list[StoredEvent], list[tuple[EventId, str]]]:
    """The events of a decoded ``HatSyncer.MsgEvents`` or ``TidingsSyncer.MsgEvents``
    (``module``) that the store can keep, and the id of each other one with why not.

    One event that cannot be decoded or stored (a ``*`` type segment from a hat-event peer,
    an empty type, a bad outbox id) must not fail its batch: the peer would send that batch
    again on every reconnect, and the sync would stop for good.
    """
    outbox = module == codec.TIDINGS_SYNCER
    events: list[StoredEvent] = []
    skipped: list[tuple[EventId, str]] = []
    for index, item in enumerate(value):
        field = f"MsgEvents[{index}]"
        try:
            event = _synced_event(item, outbox, field)
        except ProtocolError as exc:
            wire_event = item["event"] if outbox else item
            skipped.append((codec.event_id_from_sbs(wire_event["id"]), str(exc)))
            continue
        problem = validate_synced_event(event)
        if problem is None:
            events.append(event)
        else:
            skipped.append((event.id, f"{field}: {problem}"))
    return events, skipped


def _synced_event(item: codec.Value, outbox: bool, field: str) -> StoredEvent:
    """One event of an events message (``outbox``: of the extension's, with its outbox id,
    checked as a new event's is, by :func:`sort_synced_events`)."""
    if not outbox:
        return codec.event_from_sbs(item, field)
    event = codec.event_from_sbs(item["event"], f"{field}.event")
    choice, outbox_id = item["outboxEventId"]
    return event if choice == "none" else replace(event, outbox_event_id=outbox_id)
