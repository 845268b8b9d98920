"""Wire compatibility with hat-event 0.8.5, both ways: its real client against our Eventer
server, and our client against its real server (lmdb backend, in a subprocess), in plaintext
(``tcp+sbs``) and over TLS (``ssl+sbs``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import hat.event.common as hat
import hat.event.eventer as hat_eventer
import pytest

from bench.harness.processes import local_address
from tests.support.certificates import TestCA, TlsSetup
from tests.support.helpers import hat_event_server
from tests.support.server_helpers import running
from tests.support.waiting import run, until
from tidings.client import TlsError, connect, json_event, json_value
from tidings.config.eventer_access import EventerIdentityConfig
from tidings.config.tls import TlsClientConfig
from tidings.events.model import NewEvent, PayloadKind
from tidings.events.query import QueryData
from tidings.server.eventer.access import EventerAccess
from tidings.server.eventer.server import EVENTER_EVENT_TYPE

pytestmark = pytest.mark.sockets


def json_payload(value: object) -> hat.EventPayload:
    return hat.EventPayload(type=hat.EventPayloadType.JSON, data=value)


def register_event(
    event_type: tuple[str, ...],
    payload: hat.EventPayload | None = None,
    source_timestamp: hat.Timestamp | None = None,
) -> hat.RegisterEvent:
    return hat.RegisterEvent(
        event_type=event_type, source_timestamp=source_timestamp, payload=payload
    )


# --- the hat-event 0.8.5 client against our server ------------------------------------------


def test_hat_client_registers_and_is_notified(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv:
            client = await hat_eventer.connect(srv.address, [("a", "*")])
            try:
                source = hat.Timestamp(s=-10, us=5)
                sbs_data = hat.SbsData(module="M", type="T", data=b"\x01\x02")
                results = await client.register_with_response(
                    [
                        register_event(("a", "json"), json_payload({"x": [1, "ü"]}), source),
                        register_event(
                            ("a", "bin"), hat.EventPayload(hat.EventPayloadType.BINARY, b"\x00")
                        ),
                        register_event(
                            ("a", "sbs"), hat.EventPayload(hat.EventPayloadType.SBS, sbs_data)
                        ),
                        register_event(("a", "?")),
                        register_event(("b",)),
                    ]
                )
                j, b, s, bad, other = results
                assert bad is None
                assert j and b and s and other
                assert len({e.event_id.session for e in (j, b, s, other)}) == 1
                assert len({e.timestamp for e in (j, b, s, other)}) == 1
                assert j.event_id.server == 1
                assert j.source_timestamp == source
                assert j.payload == json_payload({"x": [1, "ü"]})
                assert b.payload.data == b"\x00"
                assert s.payload == hat.EventPayload(hat.EventPayloadType.SBS, sbs_data)
                assert await client.receive() == [j, b, s]  # ('b',) is not subscribed

                client.register([register_event(("a", "fire"), json_payload(1))])
                [fired] = await client.receive()
                assert fired.event_type == ("a", "fire")
                assert fired.event_id.session == j.event_id.session + 1
            finally:
                await client.async_close()

    run(main())


def test_hat_client_queries(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv:
            client = await hat_eventer.connect(srv.address)
            try:
                registered = []
                for index, event_type in enumerate(
                    [("q", "a"), ("q", "b"), ("q", "a"), ("q", "x", "y"), ("r",)]
                ):
                    source = hat.Timestamp(s=100 - index, us=0)
                    [event] = await client.register_with_response(
                        [register_event(event_type, json_payload(index), source)]
                    )
                    registered.append(event)

                async def values(**query: object) -> list[object]:
                    events = await client.query(hat.QueryData(**query))
                    return [e.payload.data for e in events]

                assert await values(event_types=[("q", "*")]) == [3, 2, 1, 0]
                assert await values(event_types=[("q", "?")]) == [2, 1, 0]
                assert await values(event_types=[("q", "?"), ("r",)], max_results=2) == [4, 2]
                assert await values(event_types=[("q", "?")], unique_type=True) == [2, 1]
                assert await values(
                    event_types=[("q", "*")], order=hat.Order.ASCENDING, max_results=3
                ) == [0, 1, 2]
                assert await values(
                    event_types=[("q", "*")], order_by=hat.OrderBy.SOURCE_TIMESTAMP
                ) == [0, 1, 2, 3]
                assert await values(
                    source_t_from=hat.Timestamp(97, 0), source_t_to=hat.Timestamp(99, 0)
                ) == [3, 2, 1]
                assert await values(event_ids=[registered[4].event_id, registered[1].event_id]) == [
                    4,
                    1,
                ]
                assert await values(t_from=registered[3].timestamp) == [4, 3]
                assert await values(server_id=1, event_types=[("r",)]) == [4]
                assert await values(payload=json_payload(2)) == [2]
                assert await values(event_types=[("*", "x")]) == []  # invalid: no events
                everything = await client.query(hat.QueryData())
                assert everything[0] == registered[4]
                assert everything[-1].event_type == EVENTER_EVENT_TYPE
                assert everything[-1].payload == json_payload("CONNECTED")
            finally:
                await client.async_close()

    run(main())


def test_hat_client_sees_eventer_events_of_others(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv:
            watcher = await hat_eventer.connect(srv.address, [("event", "eventer")])
            try:
                await watcher.query(hat.QueryData(max_results=0))  # subscribed by now
                async with await connect(srv.address):
                    [connected] = await watcher.receive()
                [disconnected] = await watcher.receive()
                assert connected.payload == json_payload("CONNECTED")
                assert disconnected.payload == json_payload("DISCONNECTED")
                assert disconnected.event_id.session == connected.event_id.session + 1
            finally:
                await watcher.async_close()

    run(main())


# --- our client against the real hat-event 0.8.5 server ------------------------------------


@pytest.fixture(scope="module")
def hat_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A hat-event 0.8.5 server with the lmdb backend; yields its eventer address."""
    with hat_event_server(tmp_path_factory.mktemp("hat-event"), 1) as (eventer_port, _, _):
        yield local_address(eventer_port)


def test_our_client_against_hat_event_server(hat_server: str) -> None:
    async def main() -> None:
        async with (
            await connect(hat_server, [("tidings", "*")]) as subscriber,
            await connect(hat_server) as client,
        ):
            await subscriber.query(QueryData(max_results=0))  # subscribed by now
            results = await client.register_with_response(
                [
                    json_event(("tidings", "json"), {"x": 1}, source_timestamp_us=-1),
                    NewEvent(("tidings", "bin"), b"\x00\x01", PayloadKind.BINARY),
                    NewEvent(("other",)),
                ]
            )
            j, b, other = results
            assert j and b and other
            assert j.id.session == b.id.session == other.id.session
            assert b.id.instance == j.id.instance + 1
            assert json_value(j) == {"x": 1}
            assert j.source_timestamp_us == -1
            assert (b.payload, b.payload_kind) == (b"\x00\x01", PayloadKind.BINARY)
            assert await subscriber.receive() == [j, b]

            await client.register([json_event(("tidings", "fire"), 2)])
            [fired] = await subscriber.receive()
            assert json_value(fired) == 2

            found = await client.query(QueryData(event_types=(("tidings", "*"),)))
            assert [e.type for e in found] == [
                ("tidings", "fire"),
                ("tidings", "bin"),
                ("tidings", "json"),
            ]
            assert found[1:] == [b, j]
            [latest] = await client.query(QueryData(event_types=(("tidings", "?"),), max_results=1))
            assert latest == fired
            eventer = await client.query(QueryData(event_types=(EVENTER_EVENT_TYPE,)))
            assert {json_value(e) for e in eventer} >= {"CONNECTED"}

    run(main())


def test_hat_event_server_stores_wildcard_types_which_we_refuse(hat_server: str) -> None:
    """A known difference: hat-event 0.8.5 stores a registered type holding ``?``; tidings
    refuses it (the event fails alone), because such an event could never be queried by its
    exact type."""

    async def main() -> None:
        async with await connect(hat_server) as client:
            ok, wildcard = await client.register_with_response(
                [NewEvent(("tidings", "ok")), NewEvent(("tidings", "?"))]
            )
            assert ok is not None
            assert wildcard is not None and wildcard.type == ("tidings", "?")

    run(main())


def test_our_client_pages_a_query_of_hat_event_server(hat_server: str) -> None:
    """``Client.query_pages`` asks only what hat-event 0.8.5 answers: pages smaller than a
    session give the events of one query, once each, in its order."""

    async def main() -> None:
        async with await connect(hat_server) as client:
            for session in range(4):
                await client.register_with_response(
                    [NewEvent(("pages", str(session), str(n))) for n in range(10)]
                )
            for order in ("ascending", "descending"):
                query = QueryData(event_types=(("pages", "*"),), order=order)
                whole = await client.query(query)
                assert len(whole) == 40
                paged = [e async for page in client.query_pages(query, 7) for e in page]
                assert paged == whole

    run(main())


# --- over TLS (ssl+sbs://), both ways ------------------------------------------------------


def test_hat_client_over_tls_with_and_without_a_client_certificate(tmp_path: Path) -> None:
    """hat-event 0.8.5's client speaks ssl+sbs as it is: without verifying the server, and
    with its ``pem_file`` (certificate and key in one file) as the client certificate that
    a server with mutual TLS requires."""
    setup = TlsSetup(tmp_path / "pki")
    client_pem = setup.ca.client("hat-client").pem

    async def round_trip(address: str, **options: object) -> None:
        client = await hat_eventer.connect(address, [("a", "*")], **options)
        try:
            [event] = await client.register_with_response(
                [register_event(("a", "tls"), json_payload({"x": 1}))]
            )
            assert event is not None and event.payload == json_payload({"x": 1})
            assert await client.receive() == [event]
        finally:
            await client.async_close()

    (tmp_path / "one").mkdir()
    (tmp_path / "mutual").mkdir()

    async def main() -> None:
        async with running(tmp_path / "one", tls=setup.server_tls()) as srv:
            assert srv.address.startswith("ssl+sbs://")
            await round_trip(srv.address)
        async with running(tmp_path / "mutual", tls=setup.server_tls(mutual=True)) as srv:
            await round_trip(srv.address, pem_file=str(client_pem))
            # Without its certificate hat's client connects (TLS 1.3 checks it after the
            # client's handshake) and is dropped before its first reply.
            refused = await hat_eventer.connect(srv.address)
            try:
                with pytest.raises(ConnectionError):
                    await refused.register_with_response([register_event(("a", "no"))])
            finally:
                await refused.async_close()
            await until(lambda: srv.server.counters.refused_handshakes == 1)
            await round_trip(srv.address, pem_file=str(client_pem))  # served on

    run(main())


def test_our_client_against_hat_event_server_over_tls(tmp_path: Path) -> None:
    """A real hat-event 0.8.5 server serving ssl+sbs (its certificate from our CA, see
    bench.harness.hat_tls_server); our client verifies it, and refuses it when its CA or
    name is not what the client expects."""
    setup = TlsSetup(tmp_path / "pki")
    other = TestCA(tmp_path / "other", "other")

    async def main(address: str) -> None:
        async with await connect(address, tls=setup.client_tls()) as client:
            [stored] = await client.register_with_response([json_event(("tidings", "tls"), 1)])
            assert stored is not None
            [found] = await client.query(QueryData(event_types=(("tidings", "tls"),)))
            assert found == stored
        with pytest.raises(TlsError, match="certificate is refused"):
            await connect(address, tls=TlsClientConfig(ca_file=str(other.cert)))
        with pytest.raises(TlsError, match="mismatch"):
            await connect(address, tls=setup.client_tls(server_name="elsewhere.example"))

    with hat_event_server(tmp_path, 1, tls_pem=setup.server.pem) as (eventer_port, _, _):
        run(main(local_address(eventer_port, "ssl+sbs")), 60)


def test_hat_client_with_a_certified_identity_is_refused_by_type_as_hat_expresses_it(
    tmp_path: Path,
) -> None:
    """hat-event 0.8.5's client, identified by its certificate, granted ``orders/*`` only:
    the refused event's result is None (hat's failed registration), the query answers the
    granted types, the subscription notifies them, and the client goes on."""
    setup = TlsSetup(tmp_path / "pki")
    pem = setup.ca.client("hat-relay").pem
    grants = {"may_register": [["orders", "*"]], "may_query": [["orders", "*"]]}
    policy = EventerAccess(identities={"hat-relay": EventerIdentityConfig(**grants)})

    async def main() -> None:
        tls = setup.server_tls(mutual=True)
        async with running(tmp_path, tls=tls, access=policy) as srv:
            client = await hat_eventer.connect(srv.address, [("*",)], pem_file=str(pem))
            try:
                order, user = await client.register_with_response(
                    [register_event(("orders", "1"), json_payload(1)), register_event(("users",))]
                )
                assert order is not None and user is None
                assert await client.receive() == [order]
                assert await client.query(hat.QueryData()) == [order]
                assert await client.query(hat.QueryData(event_types=[("users", "*")])) == []
                [later] = await client.register_with_response([register_event(("orders", "2"))])
                assert later is not None
            finally:
                await client.async_close()

    run(main())
