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

from tidings.events.model import EventType, StoredEvent
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
    events: list[StoredEvent] = []
    for index, item in enumerate(value):
        event = codec.event_from_sbs(item["event"], f"MsgEvents[{index}].event")
        choice, outbox_id = item["outboxEventId"]
        if choice == "value":
            # Checked as every synced event's outbox id is, by the store.
            event = replace(event, outbox_event_id=outbox_id)
        events.append(event)
    return events
