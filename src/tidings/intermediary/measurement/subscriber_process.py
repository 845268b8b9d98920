"""One subscriber process of a fan-out measurement (:mod:`.fanout`): many WebSocket
connections to intermediaries, each one subscriber with one region, counting what arrives.

Run as ``python -m tidings.intermediary.measurement.subscriber_process`` with a JSON plan on stdin's
first line (``{"subscribers": [{"url", "region", "rate_hz", "capabilities"}, ...]}``). It
connects and subscribes every subscriber, prints ``ready``, and waits for ``go T0 T1``
(wall-clock Unix seconds) on stdin. Frames received in ``[T0, T1)`` are counted per
subscriber (and the time from the first to the last), with their staleness (receipt time
less the frame's ``tick_time``: the same machine clock as the publisher's) and the size of
the view the subscriber holds after each (what a publisher would have sent it directly).
At ``T1`` it prints one JSON line of results and exits.

Only the frame header is read (:data:`.generation.HEADER`), on a cheap receive path
(:mod:`.wsreceive`, after the library's handshake): decoding the payload is the subscriber's
business, not the measurement's, and these processes share the cores with the tier they
measure.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import uvloop
import websockets

from tidings.intermediary.measurement.wsreceive import FrameReader, take_over
from tidings.intermediary.node.generation import HEADER, FrameKind

#: Seconds one connection's opening handshake may take.
OPEN_S = 60.0
#: The longest plan line read from stdin (about 200 bytes a subscriber).
PLAN_LINE_LIMIT = 64 * 1024 * 1024


@dataclass
class Counts:
    """What one subscriber received within the window."""

    frames: int = 0
    first: float = 0.0  # receipt time of the window's first frame
    last: float = 0.0  # and of its last
    view_entities: int = 0  # summed over the frames: the view held after each
    staleness_ms: list[float] = field(default_factory=list)
    closed: str | None = None


class Subscriber:
    """One subscriber's counting: the :class:`.wsreceive.FrameReader`'s handlers."""

    def __init__(self) -> None:
        self.counts = Counts()
        self.held = 0  # the entities of the view the subscriber now holds
        self.t0 = self.t1 = float("inf")  # the window, once known

    def binary(self, buf: bytearray, start: int, end: int) -> None:
        """Count one frame (in its envelope: a key length byte and the key first)."""
        now = time.time()
        _, _, kind, _, count, _, _, _, tick_time = HEADER.unpack_from(buf, start + 1 + buf[start])
        if kind == FrameKind.VIEW:
            self.held = count
        elif kind == FrameKind.EMPTY:
            self.held = 0
        if self.t0 <= now < self.t1:
            counts = self.counts
            if not counts.frames:
                counts.first = now
            counts.last = now
            counts.frames += 1
            counts.view_entities += self.held
            if tick_time > 0:
                counts.staleness_ms.append(round((now - tick_time) * 1000, 2))

    def text(self, message: str) -> None:
        reply = json.loads(message)
        if reply.get("op") == "error":
            self.counts.closed = f"refused: {reply.get('message')}"

    def closed(self, why: str) -> None:
        if self.counts.closed is None:
            self.counts.closed = why


async def _subscribe(plan: dict[str, Any], subscriber: Subscriber) -> FrameReader:
    """Connect (the library's handshake), read the hello, then hand the socket to a
    :class:`.wsreceive.FrameReader` and send the subscription through it (the server sends
    nothing between the two, so no byte is left with the library)."""
    # The tier answers a thousand opening handshakes at once on a loaded machine: the
    # library's 10 s default can expire; the parent bounds the whole start (READY_TIMEOUT_S).
    websocket = await websockets.connect(
        plan["url"], max_size=None, compression=None, ping_interval=None, open_timeout=OPEN_S
    )
    hello = json.loads(await websocket.recv())
    if hello.get("op") != "hello":
        raise RuntimeError(f"expected a hello, got {hello!r}")
    reader = take_over(websocket, subscriber.binary, subscriber.text, subscriber.closed)
    request = {
        "op": "subscribe",
        "key": "v",
        "region": plan["region"],
        "rate_hz": plan["rate_hz"],
        "capabilities": plan.get("capabilities"),
    }
    reader.send_text(json.dumps(request))
    return reader


async def main() -> None:
    loop = asyncio.get_running_loop()
    # The plan line lists every subscriber of this process: far past the default 64 KiB.
    reader = asyncio.StreamReader(limit=PLAN_LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    plan = json.loads(await reader.readline())
    subscribers = [Subscriber() for _ in plan["subscribers"]]
    readers = await asyncio.gather(
        *(_subscribe(p, s) for p, s in zip(plan["subscribers"], subscribers, strict=True))
    )
    print("ready", flush=True)
    _, t0, t1 = (await reader.readline()).decode().split()
    for subscriber in subscribers:
        subscriber.t0, subscriber.t1 = float(t0), float(t1)
    counts = [s.counts for s in subscribers]
    await asyncio.sleep(max(0.0, float(t1) - time.time()) + 0.05)
    result = {
        "frames": [c.frames for c in counts],
        "spans": [c.last - c.first for c in counts],
        "view_entities": [c.view_entities for c in counts],
        "staleness_ms": [s for c in counts for s in c.staleness_ms],
        "closed": [c.closed for c in counts if c.closed is not None],
    }
    print(json.dumps(result), flush=True)
    for frames in readers:
        frames.close()


if __name__ == "__main__":
    # uvloop: the receive path is mostly the event loop's own work (socket reads, callbacks),
    # which uvloop does in C; measured ~51 -> ~30 us of CPU per frame received (README).
    uvloop.run(main())
