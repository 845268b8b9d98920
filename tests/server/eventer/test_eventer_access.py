"""Who may use the Eventer, and for what, on real sockets: identities from client
certificates and from the login extension, anonymous clients by where they connect from,
and grants by type (a refused event fails alone, a query or a subscription is narrowed);
every refusal names the identity and the type, and the connection goes on."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.support.certificates import TlsSetup
from tests.support.server_helpers import running, warnings_of
from tests.support.waiting import run
from tidings.client import (
    AccessDenied,
    ConnectionClosed,
    QueryData,
    connect,
    json_event,
    json_value,
)
from tidings.config.eventer_access import EventerAnonymousConfig, EventerIdentityConfig
from tidings.config.passwords import hash_password
from tidings.events.sources import Source, SourceKind
from tidings.server.eventer.access import EventerAccess

pytestmark = pytest.mark.sockets

#: A cheap hash for tests (the configured cost is the production one).
SECRET_HASH = hash_password("s3cret", n=2**4)

ORDERS_ONLY = {
    "may_register": [["orders", "*"]],
    "may_query": [["orders", "*"]],
    "may_subscribe": [["orders", "*"]],
}


def access(anonymous: dict[str, Any] | None = None, **identities: dict[str, Any]) -> EventerAccess:
    return EventerAccess(
        EventerAnonymousConfig(**(anonymous or {})),
        {name: EventerIdentityConfig(**grants) for name, grants in identities.items()},
    )


def test_a_certified_identity_gets_what_it_is_granted_and_is_told_no_for_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup = TlsSetup(tmp_path / "pki")
    policy = access(relay=ORDERS_ONLY, admin={})

    async def main() -> None:
        tls = setup.server_tls(mutual=True)
        async with running(tmp_path, tls=tls, access=policy) as srv:
            admin = await connect(srv.address, tls=setup.client_tls("admin"))
            relay = await connect(srv.address, [("*",)], tls=setup.client_tls("relay"))
            try:
                order, user = await relay.register_with_response(
                    [json_event(("orders", "1"), 1), json_event(("users", "1"), 2)]
                )
                assert order is not None and user is None  # the user event failed alone
                [other_user] = await admin.register_with_response([json_event(("users", "2"), 3)])
                assert other_user is not None
                [later] = await admin.register_with_response([json_event(("orders", "2"), 4)])
                # Subscribed to everything, notified of orders only.
                assert await relay.receive() == [order]
                assert await relay.receive() == [later]
                # A query for everything is narrowed to orders; one for users gets nothing.
                found = await relay.query(QueryData(event_types=(("*",),)))
                assert [json_value(e) for e in found] == [4, 1]
                assert await relay.query(QueryData(event_types=(("users", "*"),))) == []
                assert await relay.query(QueryData()) == found
                assert await relay.query_latest_by_key(("users", "2")) == []
                # The connection goes on for what is allowed.
                [again] = await relay.register_with_response([json_event(("orders", "3"), 5)])
                assert again is not None
                counters = srv.server.counters
                assert counters.refused_events == 1
                assert counters.refused_queries == 4
                assert counters.refused_subscriptions == 1
            finally:
                await relay.aclose()
                await admin.aclose()

    with caplog.at_level(logging.WARNING, logger="tidings.server.eventer"):
        run(main())
    refusals = [w for w in warnings_of(caplog) if "may not" in w]
    assert any("identity 'relay'" in w and "may not register users/1" in w for w in refusals)
    assert any("may not subscribe to *" in w for w in refusals)
    assert any("may not query *" in w for w in refusals)
    assert any("may not query users/*" in w for w in refusals)
    # Each refused type once per connection: the repeated "*" query is not logged again.
    assert sum("may not query *:" in w for w in refusals) == 1


def test_a_certificate_naming_no_listed_identity_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup = TlsSetup(tmp_path / "pki")

    async def main() -> None:
        tls = setup.server_tls(mutual=True)
        async with running(tmp_path, tls=tls, access=access(relay={})) as srv:
            stranger = await connect(srv.address, tls=setup.client_tls("mallory"))
            with pytest.raises(ConnectionClosed):
                await stranger.query(QueryData(max_results=0))
            await stranger.aclose()
            async with await connect(srv.address, tls=setup.client_tls("relay")) as relay:
                assert await relay.query(QueryData(max_results=0)) == []
            assert srv.server.counters.refused_clients == 1

    with caplog.at_level(logging.WARNING):
        run(main())
    assert any(
        "'mallory' is not one of eventer_server.identities" in w for w in warnings_of(caplog)
    )


def test_logging_in_names_the_client_and_a_wrong_password_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = access(relay={**ORDERS_ONLY, "password_hash": SECRET_HASH})

    async def main() -> None:
        async with running(tmp_path, access=policy) as srv:
            async with await connect(srv.address, identity="relay", password="s3cret") as relay:
                [refused] = await relay.register_with_response([json_event(("users", "1"), 1)])
                assert refused is None
                [order] = await relay.register_with_response([json_event(("orders", "1"), 1)])
                assert order is not None
            # Anonymous on loopback may do everything: a failed login leaves it anonymous.
            async with await connect(srv.address) as client:
                with pytest.raises(
                    AccessDenied, match="unknown identity 'relay' or wrong password"
                ):
                    await client.login("relay", "guess")
                with pytest.raises(AccessDenied, match="log in with the first message, once"):
                    await client.login("relay", "s3cret")
                [stored] = await client.register_with_response([json_event(("users", "2"), 2)])
                assert stored is not None
            with pytest.raises(AccessDenied, match="unknown identity 'nobody'"):
                await connect(srv.address, identity="nobody", password="s3cret")
            assert srv.server.counters.refused_logins == 3
            # The store knows who registered what: each connection, by its identity if any.
            sources = srv.store.sources_of([order.id, stored.id])
            assert sources == {
                order.id: Source(SourceKind.EVENTER, 1, "relay"),
                stored.id: Source(SourceKind.EVENTER, 2),
            }

    with caplog.at_level(logging.WARNING):
        run(main())
    logged = "\n".join(warnings_of(caplog))
    assert "login of" in logged and "s3cret" not in logged and "guess" not in logged


def test_where_anonymous_clients_are_not_served_they_must_log_in_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = access({"allowed_from": "nowhere"}, relay={"password_hash": SECRET_HASH})

    async def main() -> None:
        async with running(tmp_path, access=policy) as srv:
            anonymous = await connect(srv.address)
            with pytest.raises(ConnectionClosed):
                await anonymous.query(QueryData(max_results=0))
            await anonymous.aclose()
            with pytest.raises(AccessDenied, match="wrong password"):
                await connect(srv.address, identity="relay", password="nope")
            async with await connect(srv.address, identity="relay", password="s3cret") as relay:
                [stored] = await relay.register_with_response([json_event(("any",), 1)])
                assert stored is not None
            # Refused clients registered no CONNECTED event: only the admitted one did.
            async with await connect(srv.address, identity="relay", password="s3cret") as relay:
                eventer = await relay.query(QueryData(event_types=(("event", "eventer"),)))
                statuses = [json_value(e) for e in eventer]
            assert statuses.count("CONNECTED") == 2  # the two logged-in connections
            assert srv.server.counters.refused_clients == 2

    with caplog.at_level(logging.WARNING):
        run(main())
    assert any("anonymous clients are served nowhere" in w for w in warnings_of(caplog))


def _outside_address() -> str | None:
    """This host's address on its network interface (not the loopback), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 1))  # TEST-NET-3: UDP, no packet is sent
            address: str = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_by_default_anonymous_clients_are_served_on_loopback_only_and_passwords_need_tls(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outside = _outside_address()
    if outside is None:
        pytest.skip("this host has no address besides the loopback")
    setup = TlsSetup(tmp_path / "pki", hosts=("127.0.0.1", outside))
    policy = access(relay={"password_hash": SECRET_HASH})

    async def main() -> None:
        async with running(tmp_path, access=policy, host="0.0.0.0") as srv:
            port = srv.server.port
            async with await connect(f"tcp+sbs://127.0.0.1:{port}") as local:
                assert await local.query(QueryData(max_results=0)) == []
            remote = await connect(f"tcp+sbs://{outside}:{port}")
            with pytest.raises(ConnectionClosed):
                await remote.query(QueryData(max_results=0))
            await remote.aclose()
            with pytest.raises(AccessDenied, match="only over TLS"):
                await connect(f"tcp+sbs://{outside}:{port}", identity="relay", password="s3cret")
        (tmp_path / "tls").mkdir()
        tls = setup.server_tls()
        async with running(tmp_path / "tls", tls=tls, access=policy, host="0.0.0.0") as srv:
            address = f"ssl+sbs://{outside}:{srv.server.port}"
            async with await connect(
                address, tls=setup.client_tls(), identity="relay", password="s3cret"
            ) as relay:
                assert await relay.query(QueryData(max_results=0)) == []

    with caplog.at_level(logging.WARNING):
        run(main())
    assert any("served on loopback only" in w for w in warnings_of(caplog))
