"""The least a Python asyncio Eventer server does per register: the benchmark's ceiling.

``python -m bench.server.floor --conf server.yaml`` (``address: tcp+sbs://host:port``) answers
hat-event 0.8.5's ``MsgRegisterReq`` as a server would — frame, pre-scan and decode with
tidings' wire code (hat-sbs), number the events, encode the reply, send — and stores nothing,
runs no engine, serves no query or subscription (pings are answered, as hat's client needs).
One asyncio Protocol, no tasks per connection. Driven by the same client as the real servers
(the server benchmark), its register rates are what no Python server on this machine can beat:
what is left between it and a real server is the cost of storing, the engine and serving
many clients safely.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from pathlib import Path

import yaml

from tidings.address import parse_address
from tidings.wire import codec, envelope

_US = 1_000_000


class FloorProtocol(asyncio.Protocol):
    """One connection: frames in, register replies out."""

    def __init__(self, numbers: itertools.count[int]) -> None:
        self._numbers = numbers
        self._buffer = bytearray()
        self._ids = itertools.count(1)
        self._transport: asyncio.Transport | None = None
        self._session = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while self._buffer:
            length_size = self._buffer[0]
            if len(self._buffer) < 1 + length_size:
                return
            size = int.from_bytes(self._buffer[1 : 1 + length_size], "big")
            end = 1 + length_size + size
            if len(self._buffer) < end:
                return
            frame = bytes(self._buffer[1 + length_size : end])
            del self._buffer[:end]
            self._on_frame(envelope.parse(frame))

    def _on_frame(self, received: envelope.Envelope) -> None:
        if received.module == codec.PING and received.type == "MsgPing":
            self._send(
                received.first, codec.PING, "MsgPong", codec.encode(codec.PING, "MsgPong", None)
            )
            return
        if (received.module, received.type) != (codec.EVENTER, "MsgRegisterReq"):
            return
        items = codec.decode(received.module, received.type, received.body)
        self._session += 1
        now = time.time_ns() // 1000
        timestamp = {"s": now // _US, "us": now % _US}
        results = [
            (
                "event",
                {
                    "id": {"server": 1, "session": self._session, "instance": next(self._numbers)},
                    "type": item["type"],
                    "timestamp": timestamp,
                    "sourceTimestamp": item["sourceTimestamp"],
                    "payload": item["payload"],
                },
            )
            for item in items
        ]
        if not received.last:
            body = codec.encode(codec.EVENTER, "MsgRegisterRes", results)
            self._send(received.first, codec.EVENTER, "MsgRegisterRes", body)

    def _send(self, first: int, module: str, type_name: str, body: bytes) -> None:
        assert self._transport is not None
        head = envelope.frame_head(
            next(self._ids), first, False, True, module, type_name, len(body)
        )
        self._transport.write(head + body)


async def serve(address: str) -> None:
    host, port = parse_address(address)
    numbers = itertools.count(1)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FloorProtocol(numbers), host, port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conf", type=Path, required=True)
    config = yaml.safe_load(parser.parse_args().conf.read_text())
    asyncio.run(serve(config["address"]))


if __name__ == "__main__":
    main()
