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
"""

from __future__ import annotations

from tidings.events.model import EventType

#: Type of the event listing the syncer server's clients.
SERVER_STATUS_TYPE: EventType = ("event", "syncer", "server")


def client_status_type(peer_server_id: int) -> EventType:
    """Type of the event telling whether our client of ``peer_server_id`` is synced."""
    return ("event", "syncer", "client", str(peer_server_id), "synced")
