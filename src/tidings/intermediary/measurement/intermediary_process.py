"""One intermediary process of a fan-out measurement (:mod:`.fanout`): an
:class:`.transport.IntermediaryServer` fed over the wire by the measurement's
:class:`.publisher.server.SimulationServer`.

Run as ``python -m tidings.intermediary.measurement.intermediary_process`` with a JSON plan on
stdin's first line (``{"upstream": URL, "world": [[lo...], [hi...]], "upstream_margin",
"max_connections", "round_s", "budget"}``). It connects upstream, starts serving, prints ``ready
PORT``, then reads commands from stdin: ``freeze`` moves its long-lived objects out of the cyclic
collector's reach (once the subscribers are connected: a full collection over a thousand connections
held the loop for ~150 ms, every frame of that moment late by as much) and answers ``frozen``. It
ends when stdin closes; it exits 3 if the upstream connection ends first.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from typing import Any

import uvloop

from tidings.intermediary.feed.remote import remote_intermediary
from tidings.intermediary.regions.geometry import Box
from tidings.intermediary.serving.transport import IntermediaryServer, TransportLimits


async def _commands(reader: asyncio.StreamReader) -> None:
    while line := await reader.readline():
        if line.strip() == b"freeze":
            gc.collect()
            gc.freeze()
            print("frozen", flush=True)


async def main() -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    plan: dict[str, Any] = json.loads(await reader.readline())
    node, feed = await remote_intermediary(
        plan["upstream"], Box(*plan["world"]), plan["upstream_margin"]
    )
    server = IntermediaryServer(
        node,
        source=feed.take,
        tick_s=plan["round_s"],
        budget=plan["budget"],
        limits=TransportLimits(max_connections=plan["max_connections"]),
    )
    await server.start()
    print("ready", server.port, flush=True)
    commands = loop.create_task(_commands(reader))
    upstream_lost = loop.create_task(feed.closed.wait())
    try:
        await asyncio.wait([commands, upstream_lost], return_when=asyncio.FIRST_COMPLETED)
        lost = upstream_lost.done()
    finally:
        commands.cancel()
        upstream_lost.cancel()
        await server.aclose()
        await feed.aclose()
    if lost:
        print(f"fanout node: upstream ended: {feed.closed_reason}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    # uvloop as in the subscriber processes: the serving is mostly the event loop's own
    # work (socket writes, callbacks), which uvloop does in C.
    sys.exit(uvloop.run(main()))
