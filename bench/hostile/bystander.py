"""The FTN18 bystander: one WebSocket to a stream, one authenticated ``pollEvents`` at a
time, each round trip printed as the server benchmark's bystander prints its own
(``<end wall time> <milliseconds> poll``, ``... 0 error <what>``); reconnects after a failure.
``python -m bench.hostile.bystander URL USER:PASSWORD``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time

import websockets

#: Pause between round trips, as the Eventer bystander's.
PAUSE_S = 0.01


async def bystander_main(url: str, sec: str) -> None:
    seq = 0
    while True:
        try:
            async with websockets.connect(url, max_size=None) as ws:
                register = {
                    "f": "futoin.evt.poll:1.1:registerConsumer",
                    "p": {"component": "BYSTANDER"},
                    "rid": "C0",
                    "sec": sec,
                }
                await ws.send(json.dumps(register))
                await ws.recv()
                while True:
                    seq += 1
                    request = {
                        "f": "futoin.evt.poll:1.1:pollEvents",
                        "p": {"component": "BYSTANDER"},
                        "rid": f"C{seq}",
                        "sec": sec,
                    }
                    started = time.perf_counter()
                    await ws.send(json.dumps(request))
                    reply = json.loads(await ws.recv())
                    done = time.perf_counter()
                    if "e" in reply:
                        print(f"{time.time():.6f} 0 error {reply['e']}", flush=True)
                    else:
                        print(f"{time.time():.6f} {(done - started) * 1000:.3f} poll", flush=True)
                    await asyncio.sleep(PAUSE_S)
        except Exception as exc:
            print(f"{time.time():.6f} 0 error {exc!r}", flush=True)
            await asyncio.sleep(0.1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("sec")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(bystander_main(args.url, args.sec))
