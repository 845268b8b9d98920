"""TLS, authentication and authorisation of an intermediary's subscribers (issue 30), over
real sockets: a real event server, the real chain, the intermediary served with TLS
(openssl-made certificates) and real clients. A handshake is refused before the upgrade
with 401 and the reason; a subscription the identity's grant does not allow is answered
with an error naming both, and the connection goes on serving what is allowed. No test
asserts timings: waits are bounded only so that a broken build fails instead of hanging."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import websockets

from tests.support.chain_helpers import ChainRig, chain_rig, next_view
from tests.support.server_helpers import running
from tidings.client import connect, json_event
from tidings.config.intermediary_access import SubscriberAccess
from tidings.config.passwords import hash_password, hash_token, new_token
from tidings.config.tls import TlsClientConfig, TlsServerConfig
from tidings.errors import AccessRefused, SubscriptionRefused
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.serving.access import Gatekeeper
from tidings.intermediary.serving.credentials import Credentials

pytestmark = pytest.mark.sockets

WAIT = 60.0
TOKEN = new_token()
#: The password of "ops", hashed at a low cost: these tests are about who, not how slow.
PASSWORD = "correct horse"
ACCESS = SubscriberAccess.model_validate(
    {
        "anonymous": {"allowed_from": "nowhere"},
        "subscribers": {
            "dash": {
                "token_hash": hash_token(TOKEN),
                "events": [["app", "orders", "*"]],
                "tables": ["users"],
                "regions": [{"lo": [0, 0], "hi": [50, 50]}],
            },
            "ops": {"password_hash": hash_password(PASSWORD, n=2**4), "events": [["*"]]},
        },
    }
)
INSIDE = {"box": {"lo": [10, 10], "hi": [20, 20]}}
OUTSIDE = {"box": {"lo": [40, 40], "hi": [60, 60]}}


def run(main: Any) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(WAIT):
            await main

    asyncio.run(bounded())


@asynccontextmanager
async def _served(
    tmp_path: Path, access: SubscriberAccess = ACCESS, **options: Any
) -> AsyncIterator[tuple[ChainRig, Any]]:
    """An intermediary chained to a real event server (row events ``db/rows.<table>``),
    admitting by ``access``; and a producer registering events into that server."""
    async with (
        running(tmp_path) as srv,
        chain_rig(
            srv.address, row_type_prefix=("db",), access=Gatekeeper.from_config(access), **options
        ) as rig,
        await connect(srv.address) as producer,
    ):
        yield rig, producer


def _server_tls(files: dict[str, str]) -> ssl.SSLContext:
    return TlsServerConfig(cert_file=files["server.pem"], key_file=files["server.key"]).context()


def _trusting(files: dict[str, str], ca: str = "ca.pem") -> ssl.SSLContext:
    return TlsClientConfig(ca_file=files[ca]).context()


async def _events_until(client: Any, payload: object) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while not got or got[-1].get("payload") != payload:
        message = await client.message(WAIT)
        if message["op"] == "event":
            got.append(message)
    return got


def test_tls_verified_while_a_wrong_ca_and_plaintext_are_refused_and_others_served(
    tmp_path: Path, tls_files: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    open_access = SubscriberAccess()  # anonymous from loopback: this test is about TLS

    async def main() -> None:
        async with _served(tmp_path, open_access, tls=_server_tls(tls_files)) as (rig, producer):
            assert rig.url.startswith("wss://")
            first = await rig.client(tls=_trusting(tls_files))
            assert first.identity == "anonymous"
            await first.subscribe_events("o", [["app", "orders", "*"]])

            with pytest.raises(ssl.SSLCertVerificationError, match="CERTIFICATE_VERIFY_FAILED"):
                await rig.client(tls=_trusting(tls_files, "other-ca.pem"))
            with pytest.raises(ssl.SSLCertVerificationError):  # the system's CAs: not ours
                await rig.client()
            plain = rig.url.replace("wss://", "ws://")
            with pytest.raises((websockets.InvalidMessage, ConnectionError, EOFError)):
                await websockets.connect(plain, open_timeout=WAIT)
            reader, writer = await asyncio.open_connection("127.0.0.1", rig.server.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # plaintext HTTP to the TLS port
            assert not (await reader.read()).startswith(b"HTTP")  # no answer in clear
            writer.close()
            # Both plaintext clients (the ws:// handshake, the raw request) refused at their
            # first byte, and counted.
            assert rig.server.counters.refusals["not_tls"] == 2

            await producer.register([json_event(("app", "orders", "x"), "after")])
            assert (await _events_until(first, "after"))[-1]["type"] == ["app", "orders", "x"]
            second = await rig.client(tls=_trusting(tls_files))
            await second.subscribe_events("o", [["app", "orders", "*"]])
            async with httpx.AsyncClient(verify=_trusting(tls_files)) as http:
                page = await http.get(f"https://127.0.0.1:{rig.server.port}/view")
                assert page.status_code == 200 and "view.js" in page.text
            for client in (first, second):
                await client.close()

    with caplog.at_level(logging.INFO):
        run(main())
    # Failed handshakes are the clients' failures: nothing for the operator's error log.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_the_handshake_admits_a_token_and_a_password_and_refuses_the_rest_with_401(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with _served(tmp_path) as (rig, _):
            dash = await rig.client(credentials=Credentials(token=TOKEN))
            ops = await rig.client(credentials=Credentials(user="ops", password=PASSWORD))
            assert (dash.identity, ops.identity) == ("dash", "ops")
            refusals = [
                (None, "anonymous subscribers are not allowed here; send a token"),
                (Credentials(token=new_token()), "the token is not known here"),
                (
                    Credentials(user="ops", password="not-it-7Q"),
                    "'ops': unknown user or wrong password",
                ),
                (Credentials(user="nobody", password=PASSWORD), "unknown user or wrong password"),
                (Credentials(user="dash", password=TOKEN), "unknown user or wrong password"),
            ]
            for credentials, reason in refusals:
                with pytest.raises(AccessRefused, match=reason) as caught:
                    await rig.client(credentials=credentials)
                assert caught.value.status == 401
                if credentials is not None:  # the secret presented is never repeated
                    assert (credentials.token or credentials.password or "") not in str(
                        caught.value
                    )
            assert rig.server.access.refused == len(refusals)

            # What a raw client sees: an HTTP 401 with a challenge, before any upgrade.
            with pytest.raises(websockets.InvalidStatus) as raw:
                await websockets.connect(rig.url, additional_headers={"Authorization": "Digest x"})
            response = raw.value.response
            assert response.status_code == 401
            assert "Bearer" in response.headers["WWW-Authenticate"]
            assert b"Authorization: unknown scheme" in response.body

            # A page's way: credentials as subprotocols, answered with "tidings".
            offered = Credentials(user="ops", password=PASSWORD).subprotocols()
            async with websockets.connect(rig.url, subprotocols=offered) as page:  # type: ignore[arg-type]
                assert page.subprotocol == "tidings"
                assert json.loads(await page.recv())["identity"] == "ops"

            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{rig.server.port}") as http:
                known = await http.get("/auth", headers=Credentials(token=TOKEN).headers())
                assert known.json() == {"identity": "dash"}
                unknown = await http.get("/auth")
                assert unknown.status_code == 401
                assert "anonymous subscribers are not allowed" in unknown.json()["error"]

            await dash.subscribe_events("o", [["app", "orders", "*"]])  # still served
            for client in (dash, ops):
                await client.close()

    with caplog.at_level(logging.INFO):
        run(main())
    # A refusal is a warning, never uvicorn's "returned without completing handshake" error.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_denials_name_the_identity_and_the_connection_serves_what_is_allowed(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with _served(tmp_path) as (rig, producer):
            dash = await rig.client(credentials=Credentials(token=TOKEN))
            await dash.subscribe_events("orders", [["app", "orders", "*"]])
            await dash.subscribe_sql("users", "SELECT id, name FROM users ORDER BY id")
            await dash.subscribe("near", INSIDE, rate_hz=50)
            join = "SELECT u.id FROM users u JOIN orders o ON o.user_id = u.id"
            relative = {"sphere": {"center": [0, 0], "radius": 5}, "relative_to": 3}
            denials = [
                (dash.subscribe_events, ("all", [["app", "*"]]), "events [app, *]"),
                (dash.subscribe_events, ("r", [["db", "rows.users"]]), "events [db, rows.users]"),
                (dash.subscribe_sql, ("o", "SELECT id FROM orders"), "table orders"),
                (dash.subscribe_sql, ("j", join), "table orders"),
                (dash.subscribe, ("far", OUTSIDE), "the region [40.0, 40.0]..[60.0, 60.0]"),
                (dash.subscribe, ("mine", relative), "a region relative to entity 3"),
            ]
            for call, arguments, refused in denials:
                with pytest.raises(
                    SubscriptionRefused, match=f"subscriber 'dash' may not .*{re.escape(refused)}"
                ):
                    await call(*arguments)  # type: ignore[operator]
            # The same key, refused, keeps what it had: "users" is still the users view.
            with pytest.raises(SubscriptionRefused, match="table orders"):
                await dash.subscribe_sql("users", "SELECT id FROM orders")

            row = {"id": 1, "name": "Ada", "city": "Oslo", "age": 36}
            await producer.register([json_event(("db", "rows.users"), {"key": 1, "row": row})])
            await producer.register([json_event(("app", "orders", "x"), "allowed")])
            assert (await _events_until(dash, "allowed"))[-1]["key"] == "orders"
            view = await next_view(dash, "users", WAIT)
            while view["rows"] != [[1, "Ada"]]:
                view = await next_view(dash, "users", WAIT)
            # This rig's spatial side has no publisher (no frames): the region is held.
            assert "near" in rig.server.intermediary.publishers.subscriptions(dash.subscriber)
            await dash.close()

    run(main())


def _non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than loopback, if it has one."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return str(address.address)
    return None


def test_anonymous_clients_are_admitted_from_loopback_only_by_default(tmp_path: Path) -> None:
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no address but loopback to connect from")

    async def main() -> None:
        async with _served(tmp_path, SubscriberAccess(), host="0.0.0.0") as (rig, _):
            local = await rig.client()
            assert local.identity == "anonymous"
            remote = f"ws://{address}:{rig.server.port}/"
            with pytest.raises(AccessRefused, match=f"from {address} \\(only from this machine\\)"):
                await IntermediaryClient.connect(remote)
            await local.close()

    run(main())


@pytest.mark.parametrize(
    ("allowed_from", "client", "admitted"),
    [
        ("loopback", "127.0.0.1", True),
        ("loopback", "127.3.4.5", True),
        ("loopback", "::1", True),
        ("loopback", "::ffff:127.0.0.1", True),
        ("loopback", "192.0.2.7", False),
        ("loopback", "::ffff:192.0.2.7", False),
        ("loopback", None, False),
        ("anywhere", "192.0.2.7", True),
        ("nowhere", "127.0.0.1", False),
    ],
)
def test_where_anonymous_clients_come_from(
    allowed_from: str, client: str | None, admitted: bool
) -> None:
    gate = Gatekeeper.from_config(
        SubscriberAccess.model_validate({"anonymous": {"allowed_from": allowed_from}})
    )

    async def main() -> None:
        if admitted:
            assert (await gate.admit({}, client)).identity == "anonymous"
        else:
            with pytest.raises(AccessRefused, match="anonymous subscribers are not allowed"):
                await gate.admit({}, client)

    run(main())
