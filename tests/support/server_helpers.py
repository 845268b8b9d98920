"""Helpers of the event-server tests: raw chatter frames on sockets, an engine on a SQLite
store of its own, an Eventer server on a free port, what a running server holds."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.waiting import run
from tidings.client import connect
from tidings.events.model import StoredEvent
from tidings.events.query import QueryData
from tidings.server.async_engine import AsyncEngine
from tidings.server.engine import Engine, Module
from tidings.server.eventer.server import EventerServer
from tidings.server.store import EventStore
from tidings.wire import codec
from tidings.wire.chatter import Connection

# --- raw frames, written from the specification (not with chatter's own sender) -------------


def raw_frame(
    module: str | None,
    type_name: str,
    body: bytes,
    *,
    message_id: int = 1,
    first: int | None = None,
    owner: bool = True,
    last: bool = True,
) -> bytes:
    """One chatter frame: length of the length, big-endian length, SBS ``Hat.Msg``."""
    envelope = {
        "id": message_id,
        "first": message_id if first is None else first,
        "owner": owner,
        "token": True,
        "last": last,
        "data": {
            "module": ("none", None) if module is None else ("value", module),
            "type": type_name,
            "data": body,
        },
    }
    return length_prefixed(codec.encode("Hat", "Msg", envelope))


def length_prefixed(message: bytes) -> bytes:
    size = len(message)
    length = size.to_bytes(max(1, (size.bit_length() + 7) // 8), "big")
    return bytes([len(length)]) + length + message


def raw_message(module: str, type_name: str, value: Any, **envelope: Any) -> bytes:
    return raw_frame(module, type_name, codec.encode(module, type_name, value), **envelope)


async def read_raw_frame(reader: asyncio.StreamReader) -> tuple[dict[str, Any], Any]:
    """The next frame's envelope and decoded body."""
    length_size = (await reader.readexactly(1))[0]
    size = int.from_bytes(await reader.readexactly(length_size), "big")
    envelope = codec.decode("Hat", "Msg", await reader.readexactly(size))
    data = envelope["data"]
    module = data["module"][1]
    return envelope, codec.decode(module, data["type"], bytes(data["data"]))


async def wait_peer_closed(reader: asyncio.StreamReader, timeout: float = 5.0) -> None:
    """Read until the peer closes (EOF or reset); fail if it stays open ``timeout`` s."""

    async def drain() -> None:
        try:
            while await reader.read(65536):
                pass
        except ConnectionError:
            pass

    await asyncio.wait_for(drain(), timeout)


async def socket_pair(
    **options: Any,
) -> tuple[Connection, asyncio.StreamReader, asyncio.StreamWriter]:
    """A chatter Connection and the raw stream of its peer, over a socket pair.

    Keep the raw writer referenced: a collected StreamWriter closes its socket.
    """
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    options.setdefault("ping_interval", None)
    connection = Connection(reader, writer, **options)
    raw_reader, raw_writer = await asyncio.open_connection(sock=theirs)
    return connection, raw_reader, raw_writer


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@asynccontextmanager
async def async_engine(
    database: Path, modules: Sequence[Module] = (), server_id: int = 1
) -> AsyncIterator[AsyncEngine]:
    """An engine on a SQLite store in the file ``database``, both closed afterwards."""
    store = EventStore(f"sqlite:///{database}", server_id)
    engine = AsyncEngine(Engine(store, list(modules)))
    try:
        yield engine
    finally:
        await engine.aclose()
        store.close()


@dataclass
class Running:
    server: EventerServer
    engine: AsyncEngine
    store: EventStore
    scheme: str = "tcp+sbs"

    @property
    def address(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server.port}"


@asynccontextmanager
async def running(
    tmp_path: Path, modules: list[Module] | None = None, host: str = "127.0.0.1", **options: Any
) -> AsyncIterator[Running]:
    """An Eventer server on a free port of ``host`` over a SQLite store in ``tmp_path`` (over
    TLS if ``options`` hold ``tls``)."""
    scheme = "tcp+sbs" if options.get("tls") is None else "ssl+sbs"
    async with async_engine(tmp_path / "events.db", modules or ()) as engine:
        server = await EventerServer.start(f"{scheme}://{host}:0", engine, **options)
        try:
            yield Running(server, engine, engine.store, scheme)
        finally:
            await server.aclose()


def event_to_sbs(event: StoredEvent) -> dict[str, Any]:
    """A stored event as hat-sbs's value of a wire ``Event`` (dicts and choices): what its
    encoder takes, and what :func:`tidings.wire.codec.encode_event` is held equal to."""
    source, kind = event.source_timestamp_us, event.payload_kind
    return {
        "id": codec.event_id_to_sbs(event.id),
        "type": list(event.type),
        "timestamp": codec.timestamp_to_sbs(event.timestamp_us),
        "sourceTimestamp": (
            ("none", None) if source is None else ("value", codec.timestamp_to_sbs(source))
        ),
        "payload": (
            ("none", None)
            if kind is None or event.payload is None
            else ("value", codec.payload_to_sbs(kind, event.payload))
        ),
    }


def server_payloads(address: str, type_root: str = "t") -> list[Any]:
    """The JSON payloads of the events under ``(type_root, *)`` that the event server at
    ``address`` holds, in its log order (as a client queries them over the Eventer)."""

    async def query() -> list[StoredEvent]:
        async with await connect(address, timeout=5) as client:
            return await client.query(QueryData(event_types=((type_root, "*"),), order="ascending"))

    return [json.loads(e.payload) for e in sorted(run(query()), key=lambda e: e.id)]
