"""An intermediary's TLS port under its accept limits (:mod:`tidings.accept`, uvicorn behind
it), on real sockets: a client silent on the TLS port is closed at the (shortened) handshake
timeout, and a third connection from an address allowed two is closed at accept, before any
TLS byte; both are counted in the refusals its metrics export, while a subscriber from
another address is served. 127.0.0.2 is loopback too (Linux routes 127/8 there)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.harness.sockets import closed_within
from tests.intermediary.serving.test_access import _served, _server_tls, _trusting, run
from tidings.config.intermediary_access import SubscriberAccess
from tidings.intermediary.serving.transport import TransportLimits

pytestmark = pytest.mark.sockets

ATTACKER = "127.0.0.2"


def test_silent_clients_and_an_address_over_its_bound_are_closed_before_tls(
    tmp_path: Path, tls_files: dict[str, str]
) -> None:
    limits = TransportLimits(max_connections_per_address=2, tls_handshake_timeout_s=0.3)

    async def main() -> None:
        async with _served(
            tmp_path, SubscriberAccess(), tls=_server_tls(tls_files), limits=limits
        ) as (rig, _):
            port = rig.server.port
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(ATTACKER, 0)
            )
            assert await closed_within(reader, 10)  # silent: closed at the timeout
            writer.close()
            held = [
                await asyncio.open_connection(
                    "127.0.0.1", port, ssl=_trusting(tls_files), local_addr=(ATTACKER, 0)
                )
                for _ in range(2)
            ]
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(ATTACKER, 0)
            )
            assert await closed_within(reader, 5)  # the third: closed at accept
            writer.close()
            subscriber = await rig.client(tls=_trusting(tls_files))
            await subscriber.subscribe_events("o", [["app", "orders", "*"]])
            await subscriber.close()
            refusals = rig.server.counters.refusals
            assert refusals["tls_handshake_timeout"] == 1
            assert refusals["too_many_from_address"] == 1
            for _, held_writer in held:
                held_writer.close()

    run(main())
