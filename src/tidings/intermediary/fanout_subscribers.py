"""One subscriber process of a fan-out measurement (:mod:`.fanout`): many WebSocket
connections to intermediaries, each one subscriber with one region, counting what arrives.

Run as ``python -m tidings.intermediary.fanout_subscribers`` with a JSON plan on stdin's
first line (``{"subscribers": [{"url", "region", "rate_hz", "capabilities"}, ...]}``). It
connects and subscribes every subscriber, prints ``ready``, and waits for ``go T0 T1``
(wall-clock Unix seconds) on stdin. Frames received in ``[T0, T1)`` are counted per
subscriber (and the time from the first to the last), with their staleness (receipt time
less the frame's ``tick_time``: the same machine clock as the publisher's) and the size of
the view the subscriber holds after each (what a publisher would have sent it directly).
At ``T1`` it prints one JSON line of results and exits.

Only the frame header is read (:data:`.generation.HEADER`): decoding the payload is the
subscriber's business, not the measurement's, and would make the subscriber processes the
bottleneck of a 2-core machine.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import websockets

from tidings.intermediary.generation import HEADER, FrameKind


@dataclass
class Counts:
    """What one subscriber received within the window."""

    frames: int = 0
    first: float = 0.0  # receipt time of the window's first frame
    last: float = 0.0  # and of its last
    view_entities: int = 0  # summed over the frames: the view held after each
    staleness_ms: list[float] = field(default_factory=list)
    closed: str | None = None


def _count(message: bytes, counts: Counts, held: int, t0: float, t1: float) -> int:
    """Count one binary message; returns the entities of the view the subscriber now holds."""
    now = time.time()
    offset = 1 + message[0]
    kind, count, tick_time = _fields(message, offset)
    if kind == FrameKind.VIEW:
        held = count
    elif kind == FrameKind.EMPTY:
        held = 0
    if t0 <= now < t1:
        if not counts.frames:
            counts.first = now
        counts.last = now
        counts.frames += 1
        counts.view_entities += held
        if tick_time > 0:
            counts.staleness_ms.append(round((now - tick_time) * 1000, 2))
    return held


def _fields(message: bytes, offset: int) -> tuple[int, int, float]:
    _, _, kind, _, count, _, _, _, tick_time = HEADER.unpack_from(message, offset)
    return kind, count, tick_time


async def _subscriber(plan: dict[str, Any]) -> Any:
    """Connect and send the subscription (its reply is read by :func:`_receive`)."""
    websocket = await websockets.connect(plan["url"], max_size=None, compression=None)
    hello = json.loads(await websocket.recv())
    if hello.get("op") != "hello":
        raise RuntimeError(f"expected a hello, got {hello!r}")
    request = {
        "op": "subscribe",
        "key": "v",
        "region": plan["region"],
        "rate_hz": plan["rate_hz"],
        "capabilities": plan.get("capabilities"),
    }
    await websocket.send(json.dumps(request))
    return websocket


async def _receive(
    websocket: Any, counts: Counts, window: asyncio.Future[tuple[float, float]]
) -> None:
    held = 0
    t0, t1 = float("inf"), float("inf")
    try:
        async for message in websocket:
            if isinstance(message, str):
                reply = json.loads(message)
                if reply.get("op") == "error":
                    counts.closed = f"refused: {reply.get('message')}"
                continue
            if window.done():
                t0, t1 = window.result()
            held = _count(message, counts, held, t0, t1)
    except websockets.ConnectionClosed:
        pass
    if counts.closed is None:
        counts.closed = f"closed {websocket.close_code} {websocket.close_reason}"


async def main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    plan = json.loads(await reader.readline())
    window: asyncio.Future[tuple[float, float]] = loop.create_future()
    counts = [Counts() for _ in plan["subscribers"]]
    sockets = await asyncio.gather(*(_subscriber(p) for p in plan["subscribers"]))
    tasks = [
        asyncio.create_task(_receive(ws, c, window)) for ws, c in zip(sockets, counts, strict=True)
    ]
    print("ready", flush=True)
    _, t0, t1 = (await reader.readline()).decode().split()
    window.set_result((float(t0), float(t1)))
    await asyncio.sleep(max(0.0, float(t1) - time.time()) + 0.05)
    result = {
        "frames": [c.frames for c in counts],
        "spans": [c.last - c.first for c in counts],
        "view_entities": [c.view_entities for c in counts],
        "staleness_ms": [s for c in counts for s in c.staleness_ms],
        "closed": [c.closed for c in counts if c.closed is not None],
    }
    print(json.dumps(result), flush=True)
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    for task in tasks:
        task.cancel()


if __name__ == "__main__":
    asyncio.run(main())
