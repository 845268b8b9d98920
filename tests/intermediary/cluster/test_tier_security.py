"""A deployed tier with TLS and subscribers (issue 30), run as a user runs it: a ``tidings
intermediary simulate`` publisher serving its feed over mutual TLS, and ``tidings
intermediary serve --tier world`` whose members serve ``wss://``, verify the publisher and
each other, and admit only configured subscribers. A subscriber redirected to another member
is the same identity there, held to the same grant; a view spanning two members is composed
through their own (TLS, member-token) connection; frames are their tick's brute force. Waits
are bounded so a broken build fails instead of hanging; nothing asserts a timing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.intermediary.cluster.test_tier import (
    ACROSS,
    AGENTS,
    EAST,
    MIDDLE,
    SEED,
    SIDE,
    SPEED,
    TICK_HZ,
    WEST,
    Replay,
    check,
    end,
    first_line,
    free_ports,
    read_into,
    start,
    stop_reading,
    until,
)
from tidings.config.passwords import hash_password, hash_token, new_token
from tidings.config.tls import TlsClientConfig
from tidings.errors import AccessRefused, IntermediaryError, SubscriptionRefused
from tidings.intermediary.client.handover import ClusterClient
from tidings.intermediary.client.subscriber import ReceivedFrame
from tidings.intermediary.serving.credentials import Credentials

pytestmark = pytest.mark.sockets

TOKEN = new_token()
PASSWORD = "tier pass"
#: "map" may see the west and middle strips (x 0..60), "scout" the west strip only.
SUBSCRIBERS = {
    "map": {"token_hash": hash_token(TOKEN), "regions": [{"lo": [0, 0], "hi": [60, SIDE]}]},
    "scout": {
        "password_hash": hash_password(PASSWORD, n=2**4),
        "regions": [{"lo": [0, 0], "hi": [30, SIDE]}],
    },
}


@pytest.fixture
def secured(tmp_path: Path, tls_files: dict[str, str]) -> Iterator[list[str]]:
    """The publisher (mutual TLS) and a tier of three members in strips along x, serving
    ``wss://`` to the configured subscribers only: the members' URLs."""
    feed_port, *ports = free_ports(4)
    client_tls = {"ca_file": tls_files["ca.pem"], "cert_file": tls_files["client.pem"],
                  "key_file": tls_files["client.key"]}  # fmt: skip
    config = {
        "intermediary_tiers": {
            "world": {
                "members": [f"127.0.0.1:{port}" for port in ports],
                "tls": {"cert_file": tls_files["server.pem"], "key_file": tls_files["server.key"]},
                "peer_tls": {"ca_file": tls_files["ca.pem"]},
                "anonymous": {"allowed_from": "nowhere"},
                "subscribers": SUBSCRIBERS,
                "spatial": {
                    "upstream": f"wss://127.0.0.1:{feed_port}/",
                    "tls": client_tls,
                    "world_lo": [0, 0],
                    "world_hi": [SIDE, SIDE],
                },
                "responsibility": {"by": "region", "cells": [3, 1]},
            }
        }
    }
    path = tmp_path / "tidings.yaml"
    path.write_text(yaml.safe_dump(config))
    publisher = start(
        "intermediary", "simulate", "--agents", str(AGENTS), "--world", str(SIDE),
        "--speed", str(SPEED), "--tick-hz", str(TICK_HZ), "--seed", str(SEED),
        "--listen", f"127.0.0.1:{feed_port}", "--tls-cert-file", tls_files["server.pem"],
        "--tls-key-file", tls_files["server.key"], "--tls-client-ca-file", tls_files["ca.pem"],
    )  # fmt: skip
    tier = None
    try:
        assert "wss://" in first_line(publisher, "simulation of")
        tier = start("intermediary", "serve", "-c", str(path), "--tier", "world")
        assert "wss://" in first_line(tier, "intermediary tier world serving")
        yield [f"wss://127.0.0.1:{port}/" for port in ports]
    finally:
        end(tier, publisher)


@pytest.mark.slow
def test_a_redirected_subscriber_keeps_its_identity_and_its_grant(
    secured: list[str], tls_files: dict[str, str]
) -> None:
    urls = secured
    trusting = TlsClientConfig(ca_file=tls_files["ca.pem"]).context()
    got: dict[str, list[ReceivedFrame]] = {"middle": [], "across": [], "west": []}
    replay = Replay()

    async def main() -> None:
        token = Credentials(token=TOKEN)
        clients: dict[str, ClusterClient] = {}
        readers = []
        try:
            # Both enter at the west member; "middle" and "across" belong to the middle one.
            for key, region in (("middle", MIDDLE), ("across", ACROSS)):
                client = await ClusterClient.connect(urls, credentials=token, tls=trusting)
                await client.subscribe(key, region, rate_hz=1000)
                assert client.where(key) == urls[1]
                assert {link.identity for link in client._links.values()} == {"map"}
                clients[key] = client
                readers.append(asyncio.create_task(read_into(got, client)))
            scout = await ClusterClient.connect(
                urls[1:], credentials=Credentials(user="scout", password=PASSWORD), tls=trusting
            )
            await scout.subscribe("west", WEST, rate_hz=1000)  # entered at the middle member
            assert scout.where("west") == urls[0]
            clients["west"] = scout
            readers.append(asyncio.create_task(read_into(got, scout)))

            # The grant follows the identity: refused at the entry, before any redirect,
            # and the same at the member that owns the region.
            for entry in (urls[0], urls[2]):
                denied = await ClusterClient.connect(entry, credentials=token, tls=trusting)
                with pytest.raises(SubscriptionRefused, match=r"subscriber 'map' may not .*region"):
                    await denied.subscribe("east", EAST)
                await denied.close()
            with pytest.raises(SubscriptionRefused, match="subscriber 'scout' may not"):
                await scout.subscribe("middle", MIDDLE)
            with pytest.raises(AccessRefused, match="anonymous subscribers are not allowed"):
                await ClusterClient.connect(urls[0], tls=trusting)
            with pytest.raises(IntermediaryError, match="CERTIFICATE_VERIFY_FAILED"):
                await ClusterClient.connect(
                    urls[0], credentials=token,
                    tls=TlsClientConfig(ca_file=tls_files["other-ca.pem"]).context(),
                )  # fmt: skip

            await until(lambda: all(len(frames) > 10 for frames in got.values()))
        finally:
            await stop_reading(readers, clients)
        for client in clients.values():
            assert client.stale == 0

    asyncio.run(asyncio.wait_for(main(), 300))
    # "across" spans the west and middle members: composed through their TLS connection.
    for key, region in (("middle", MIDDLE), ("across", ACROSS), ("west", WEST)):
        check(got[key], region, replay)
