"""The intermediary's bystander: registers one event at the event server (hat's client, over
TLS) and waits for it to arrive through the intermediary (a subscriber over ``wss://``,
authenticated with a password), forever; each round trip printed as the server benchmark's
bystander prints its own (``<end wall time> <milliseconds> event``, ``... 0 error <what>``);
reconnects both after a failure.
``python -m bench.hostile.intermediary_bystander URL CA_FILE USER:PASSWORD EVENTER``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ssl
import time

import hat.event.common as hc
from hat.event import eventer

from tidings.intermediary.client import Credentials, IntermediaryClient

#: The bystander's event types: ``(*TYPE, <n>)``.
TYPE = ("bench", "hostile", "bystander")
#: Pause between round trips, as the other bystanders'.
PAUSE_S = 0.01
#: A round trip not done by then is an error (and the connections are made anew).
TIMEOUT_S = 30.0


async def _round_trip(hat: eventer.Client, sub: IntermediaryClient, seq: int) -> float:
    """Register event ``seq``; milliseconds until the intermediary delivered it."""
    event = hc.RegisterEvent(
        event_type=(*TYPE, str(seq % 10)),
        source_timestamp=None,
        payload=hc.EventPayload(type=hc.EventPayloadType.JSON, data=seq),
    )
    started = time.perf_counter()
    hat.register([event])
    async with asyncio.timeout(TIMEOUT_S):
        while True:
            message = await sub.message()
            if message.get("op") == "event" and message.get("payload") == seq:
                return (time.perf_counter() - started) * 1000


async def bystander_main(url: str, ca_file: str, login: str, address: str) -> None:
    user, _, password = login.partition(":")
    tls = ssl.create_default_context(cafile=ca_file)
    seq = 0
    while True:
        try:
            async with contextlib.AsyncExitStack() as stack:
                sub = await IntermediaryClient.connect(
                    url, credentials=Credentials(user=user, password=password), tls=tls
                )
                stack.push_async_callback(sub.close)
                await sub.subscribe_events("bystander", [[*TYPE, "*"]])
                hat = await eventer.connect(address, [])
                stack.push_async_callback(hat.async_close)
                while True:
                    seq += 1
                    ms = await _round_trip(hat, sub, seq)
                    print(f"{time.time():.6f} {ms:.3f} event", flush=True)
                    await asyncio.sleep(PAUSE_S)
        except Exception as exc:
            print(f"{time.time():.6f} 0 error {exc!r}"[:400], flush=True)
            await asyncio.sleep(0.1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    for name in ("url", "ca_file", "login", "eventer"):
        parser.add_argument(name)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(bystander_main(args.url, args.ca_file, args.login, args.eventer))
