"""A synced event the store cannot keep is skipped, and the sync goes on past it.

The peer is a raw syncer server on a real socket (frames written from the specification),
since neither tidings nor hat-event 0.8.5 sends every kind of bad event (a hat-event peer
may send a wildcard type segment): it sends each kind of bad event with good ones, in one
MsgEvents and in separate ones, and its last event bad; then it drops the connection, and
checks where our real SyncerClient, over a real SQLite store, resumes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from bench.harness.processes import local_address
from tests.support.server_helpers import async_engine, event_to_sbs, raw_message, read_raw_frame
from tests.support.waiting import run, until
from tidings.client import json_event
from tidings.events.model import EventId, PayloadKind, StoredEvent
from tidings.server.syncer.client import SyncerClient
from tidings.wire import codec

pytestmark = [pytest.mark.sockets, pytest.mark.timeout(60)]

PEER = 7


def synced(
    session: int, instance: int, event_type: tuple[str, ...], outbox: str | None
) -> StoredEvent:
    """An event of the peer, as it sends it."""
    return StoredEvent(
        0,
        EventId(PEER, session, instance),
        event_type,
        1_700_000_000_000_000,
        None,
        b'{"n": 1}',
        PayloadKind.JSON,
        outbox,
    )


#: Each kind of bad event: the module it comes in, and how to make it from a good one.
BAD: dict[str, tuple[str, Callable[[int, int], StoredEvent]]] = {
    "wildcard segment": ("HatSyncer", lambda s, i: synced(s, i, ("bad", "*"), None)),
    "query wildcard ?": ("HatSyncer", lambda s, i: synced(s, i, ("?",), None)),
    "empty type": ("HatSyncer", lambda s, i: synced(s, i, (), None)),
    "overlong outbox id": ("TidingsSyncer", lambda s, i: synced(s, i, ("bad",), "x" * 501)),
    "outbox id with NUL": ("TidingsSyncer", lambda s, i: synced(s, i, ("bad",), "a\x00b")),
    "empty outbox id": ("TidingsSyncer", lambda s, i: synced(s, i, ("bad",), "")),
    "payload not JSON": (
        "HatSyncer",
        lambda s, i: replace(synced(s, i, ("bad",), None), payload=b"{not json"),
    ),
}


def good(session: int, instance: int, module: str) -> StoredEvent:
    outbox = f"ob-{session}-{instance}" if module == "TidingsSyncer" else None
    return synced(session, instance, ("good", str(session), str(instance)), outbox)


def events_message(module: str, events: list[StoredEvent]) -> bytes:
    if module == "HatSyncer":
        return raw_message(module, "MsgEvents", [event_to_sbs(e) for e in events])
    items = [
        {
            "event": event_to_sbs(e),
            "outboxEventId": ("none", None)
            if e.outbox_event_id is None
            else ("value", e.outbox_event_id),
        }
        for e in events
    ]
    return raw_message(module, "MsgEvents", items)


@pytest.mark.parametrize("together", [True, False], ids=["one message", "separate messages"])
@pytest.mark.parametrize("kind", list(BAD))
def test_invalid_synced_event_is_skipped_and_the_sync_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str, together: bool
) -> None:
    module, make_bad = BAD[kind]
    bad_first, good_first = make_bad(1, 1), good(1, 2, module)
    # Last in the backlog, so that only our client's memory keeps it from being sent again.
    good_last, bad_last = good(2, 1, module), make_bad(2, 2)
    later = good(3, 1, module)
    requests: list[EventId] = []
    drop = asyncio.Event()

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, request = await read_raw_frame(reader)
        requests.append(codec.event_id_from_sbs(request["lastEventId"]))
        if len(requests) == 1:
            if together:
                writer.write(events_message(module, [bad_first, good_first]))
            else:
                writer.write(events_message(module, [bad_first]))
                writer.write(events_message(module, [good_first]))
            writer.write(events_message(module, [good_last, bad_last]))
            writer.write(raw_message("HatSyncer", "MsgSynced", None))
            await drop.wait()
        else:
            # A peer sends what follows the client's last id: the next event only.
            writer.write(raw_message("HatSyncer", "MsgSynced", None))
            writer.write(events_message(module, [later]))
            await reader.read()  # until our client disconnects
        writer.close()

    async def main() -> tuple[list[StoredEvent], list[StoredEvent]]:
        server = await asyncio.start_server(peer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with async_engine(tmp_path / "events.db", server_id=2) as engine:
            client = SyncerClient(local_address(port), engine, PEER, min_delay=0.05)
            await client.start()
            await client.wait_synced(10)
            first = [e for e in engine.store.read(0, 100) if e.id.server == PEER]
            drop.set()
            await until(lambda: engine.store.last_event_id(PEER) == later.id)
            # The server keeps serving: its own registrations go on.
            await engine.register([json_event(("own",), 1)])
            stored = engine.store.read(0, 100)
            await client.aclose()
        server.close()
        return first, stored

    with caplog.at_level(logging.ERROR, "tidings.server.syncer.client"):
        first, stored = run(main())

    assert [e.id for e in first] == [good_first.id, good_last.id]
    assert [(e.type, e.payload, e.outbox_event_id) for e in first] == [
        (good_first.type, good_first.payload, good_first.outbox_event_id),
        (good_last.type, good_last.payload, good_last.outbox_event_id),
    ]
    # Resumed after the skipped last event: not sent, skipped and logged again.
    assert requests == [EventId(PEER, 0, 0), bad_last.id]
    peer_ids = [e.id for e in stored if e.id.server == PEER]
    assert peer_ids == [good_first.id, good_last.id, later.id]
    assert [e.type for e in stored if e.id.server == 2][-1] == ("own",)
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name == "tidings.server.syncer.client"
    ]
    assert len(errors) == 2, errors
    for message, bad in zip(errors, [bad_first, bad_last], strict=True):
        assert f"server {PEER} at tcp+sbs://127.0.0.1:" in message
        assert str(bad.id) in message
        assert "skipped" in message
    reason = {
        "wildcard segment": "reserved as a query wildcard",
        "query wildcard ?": "reserved as a query wildcard",
        "empty type": "non-empty tuple",
        "overlong outbox id": "over 500 bytes",
        "outbox id with NUL": "NUL",
        "empty outbox id": "non-empty str",
        "payload not JSON": "not valid JSON",
    }[kind]
    assert all(reason in message for message in errors), errors
