"""The relay publishing into a remote tidings event server (the event_server target).

The server is a real ``tidings server`` process; the target talks to it over a real socket.
"""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from bench.harness.processes import TIDINGS, ServerProcess, bench_env, free_port, local_address
from tests.support.certificates import TestCA, TlsSetup
from tests.support.helpers import relay_config, statuses
from tests.support.waiting import run
from tests.support.witness_module import witness_config
from tidings.client import connect
from tidings.config import TidingsConfig, load_config
from tidings.config.tls import TlsClientConfig
from tidings.db import make_engine
from tidings.errors import ConfigError, TargetCallFailed, TargetUnavailable
from tidings.events.model import StoredEvent
from tidings.events.outbox import OutboxEvent
from tidings.events.query import QueryData
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.pipeline.relay_query import start_relay
from tidings.targets.kinds.event_server import EventServerTarget
from tidings.targets.kinds.event_server_config import EventServerTargetConfig

pytestmark = pytest.mark.sockets


@pytest.fixture
def server(tmp_path: Path):
    ports = {"eventer": free_port(), "syncer": free_port()}
    process = ServerProcess.tidings(tmp_path / "server", 1, ports)
    process.start()
    yield process
    process.stop()


def _outbox_event(n: int, event_id: str | None = None) -> OutboxEvent:
    return OutboxEvent(
        seq=n + 1,
        event_id=event_id or f"evt-{n}",
        event_type="Created",
        payload=json.dumps({"n": n}),
        logged_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def _events(server: ServerProcess, types: tuple[str, ...] = ("t", "*")) -> list[StoredEvent]:
    async def query() -> list[StoredEvent]:
        async with await connect(server.eventer) as client:
            return await client.query(QueryData(event_types=(types,), order="ascending"))

    return run(query())


def _target(server: ServerProcess, **extra: object) -> EventServerTarget:
    config = EventServerTargetConfig(
        kind="event_server", address=server.eventer, type_prefix=["t"], timeout="3s", **extra
    )
    return EventServerTarget("remote", config)


def _relay_into(server: ServerProcess, tmp_path: Path, **relay: object) -> TidingsConfig:
    """A relay's configuration (``relay`` its settings) routing ``Created`` events to
    ``server`` as the target ``remote``, their types under ``t``."""
    targets = {"remote": {"kind": "event_server", "address": server.eventer, "type_prefix": ["t"]}}
    return relay_config(tmp_path, targets=targets, routes={"Created": ["remote"]}, **relay)


def test_publish_is_confirmed_and_a_second_publish_stores_nothing_new(server) -> None:
    target = _target(server)
    try:
        events = [_outbox_event(n) for n in range(5)]
        assert target.publish(events) == [None] * 5
        assert target.publish(events[2:]) == [None] * 3
    finally:
        target.close()
    stored = _events(server)
    assert [e.outbox_event_id for e in stored] == [None] * 5  # the wire does not echo it
    assert [json.loads(e.payload)["n"] for e in stored] == [0, 1, 2, 3, 4]
    assert {e.type for e in stored} == {("t", "Created")}
    assert {e.source_timestamp_us for e in stored} == {1_767_225_600_000_000}


def test_server_down_is_unavailable_then_recovers(server) -> None:
    target = _target(server)
    try:
        server.kill()
        with pytest.raises(TargetUnavailable, match="event server target 'remote'"):
            target.publish([_outbox_event(1), _outbox_event(2)])
        server.start()
        assert target.publish([_outbox_event(1), _outbox_event(2)]) == [None, None]
    finally:
        target.close()
    assert [json.loads(e.payload)["n"] for e in _events(server)] == [1, 2]


def test_a_hat_style_server_without_the_extension_is_a_clear_error(tmp_path: Path) -> None:
    """A port where nothing listens stands for any unreachable server."""
    config = EventServerTargetConfig(
        kind="event_server", address=local_address(free_port()), timeout="1s"
    )
    target = EventServerTarget("remote", config)
    try:
        with pytest.raises(TargetUnavailable, match="Connect call failed"):
            target.publish([_outbox_event(1)])
    finally:
        target.close()


def test_a_server_that_never_answers_times_out_and_the_next_call_starts_afresh(
    server,
) -> None:
    """A peer that accepts connections but never replies: the call fails within the
    timeout; nothing of it runs on afterwards, and the target recovers on its own."""

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        config = EventServerTargetConfig(
            kind="event_server",
            address=local_address(silent.getsockname()[1]),
            timeout="500ms",
        )
        target = EventServerTarget("remote", config)
        try:
            with pytest.raises(TargetCallFailed, match="TimeoutError"):
                target.publish([_outbox_event(1)])
        finally:
            target.close()
    good = _target(server)
    try:
        assert good.publish([_outbox_event(2)]) == [None]
    finally:
        good.close()


@pytest.mark.spark
def test_relay_into_a_remote_server_is_exactly_once(spark, server, tmp_path: Path) -> None:
    config = _relay_into(server, tmp_path, max_events_per_batch=40)
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    ids = []
    for n in range(100):
        with outbox.transaction() as tx:
            ids.append(tx.emit("Created", {"n": n}, partition_key=f"k{n % 3}"))
    start_relay(spark, config, available_now=True).awaitTermination()
    assert set(statuses(engine).values()) == {"PUBLISHED"}
    stored = _events(server)
    numbers = [json.loads(e.payload)["data"]["n"] for e in sorted(stored, key=lambda e: e.id)]
    assert sorted(numbers) == list(range(100))
    for key in range(3):  # per partition key, in the order the service emitted them
        of_key = [n for n in numbers if n % 3 == key]
        assert of_key == sorted(of_key)
    # Publishing the same outbox events again (a relay crash before it recorded them) adds
    # nothing: the server recognises their outbox ids.
    again = _target(server)
    try:
        assert again.publish([_outbox_event(n, ids[n]) for n in (0, 50, 99)]) == [None] * 3
    finally:
        again.close()
    assert len(_events(server)) == 100


@pytest.mark.spark
def test_an_event_the_server_refuses_fails_alone(spark, tmp_path: Path) -> None:
    """A real server with a small frame limit closes the connection on a request holding one
    too-large event: the relay narrows the call down, the others are stored once, in order."""
    server = ServerProcess.tidings(
        tmp_path / "server",
        1,
        {"eventer": free_port(), "syncer": free_port()},
        eventer={"max_frame_bytes": 64 * 1024},
    )
    server.start()
    try:
        config = _relay_into(server, tmp_path, partitions=1)
        engine = make_engine(config.database.url)
        outbox = Outbox(engine)
        for n in range(30):
            with outbox.transaction() as tx:
                payload = {"n": n, "pad": "x" * (100_000 if n == 13 else 10)}
                tx.emit("Created", payload, partition_key=f"k{n % 10}")
        start_relay(spark, config, available_now=True).awaitTermination()
        rows = statuses(engine)
        assert rows[14] == "FAILED"
        assert {rows[s] for s in (24,)} == {"HELD"}  # k3's next event waits for it
        assert {s for s, status in rows.items() if status == "PUBLISHED"} == set(range(1, 31)) - {
            14,
            24,
        }
        with engine.connect() as conn:
            row = conn.execute(select(outbox_event).where(outbox_event.c.seq == 14)).one()
        assert "event server target 'remote'" in row.error_details
        assert all(r.retry_count == 0 for r in _log_rows(engine) if r.seq != 14)
        numbers = [json.loads(e.payload)["data"]["n"] for e in _events(server)]
        assert sorted(numbers) == sorted(set(range(30)) - {13, 23})
    finally:
        server.stop()


@pytest.mark.spark
def test_the_servers_modules_see_relayed_events(spark, tmp_path: Path) -> None:
    """A module of the server (engine.modules) is offered every relayed event in the session
    it is stored in, once: a batch published again is recognised before the modules see it."""
    port = free_port()
    config = {
        "type": "event",
        "backend": {"module": "tidings.server.backends.sqlite", "db_path": "ev.db"},
        "engine": {"server_id": 1, "modules": [witness_config(["t", "*"])]},
        "eventer_server": {"address": local_address(port)},
    }
    # The module is a module of the checkout's tests: on the server's PYTHONPATH.
    server = ServerProcess(
        [*TIDINGS, "server"], tmp_path / "server", config, {"eventer": port}, env=bench_env()
    )
    server.start()
    try:
        relay = _relay_into(server, tmp_path, max_events_per_batch=7)
        outbox = Outbox(make_engine(relay.database.url))
        for n in range(20):
            with outbox.transaction() as tx:
                tx.emit("Created", {"n": n}, partition_key=f"k{n % 3}")
        start_relay(spark, relay, available_now=True).awaitTermination()
        # A relay crash before it recorded its last batch: the batch comes again.
        batch = [_outbox_event(n, event_id) for n, event_id in _ids(server)[-5:]]
        again = _target(server)
        try:
            assert again.publish(batch) == [None] * 5
        finally:
            again.close()
        relayed, witnesses = _events(server, ("t", "*")), _events(server, ("witness", "*"))
    finally:
        server.stop()
    assert sorted(json.loads(e.payload)["data"]["n"] for e in relayed) == list(range(20))
    # Each answered once, in the session it was stored in.
    assert sorted((json.loads(w.payload)["of"], w.id.session) for w in witnesses) == sorted(
        (json.loads(e.payload)["id"], e.id.session) for e in relayed
    )


def _ids(server: ServerProcess) -> list[tuple[int, str]]:
    """The ``n`` and outbox event id (the envelope's ``id``) of each stored event, in order."""
    envelopes = [json.loads(e.payload) for e in _events(server)]
    return [(envelope["data"]["n"], envelope["id"]) for envelope in envelopes]


def _log_rows(engine) -> list:
    with engine.connect() as conn:
        return conn.execute(select(outbox_event)).all()


# -- type templates ------------------------------------------------------------------------


def _typed_event(seq: int, key: str, headers: dict[str, str]) -> OutboxEvent:
    return OutboxEvent(
        seq=seq,
        event_id=f"evt-{seq}",
        event_type="Created",
        payload=json.dumps({"n": seq}),
        logged_at=datetime(2026, 1, 1, tzinfo=UTC),
        partition_key=key,
        headers=headers,
    )


def test_types_come_from_a_template_and_an_event_without_its_header_fails_alone(
    server,
) -> None:
    config = EventServerTargetConfig(
        kind="event_server",
        address=server.eventer,
        timeout="3s",
        type_template=["orders", "{headers.aggregate_type}", "{event_type}"],
    )
    target = EventServerTarget("remote", config)
    events = [
        _typed_event(1, "a", {"aggregate_type": "order"}),
        _typed_event(2, "b", {}),  # no aggregate_type header
        _typed_event(3, "c", {"aggregate_type": "invoice"}),
        _typed_event(4, "b", {"aggregate_type": "order"}),  # behind seq 2 of its key
    ]
    try:
        results = target.publish(events)
        refusal = target.refusal(events[1])
    finally:
        target.close()

    assert results[0] is None and results[2] is None
    assert results[1] == (
        "event server target 'remote': no type for event evt-2 (seq 2): placeholder "
        "{headers.aggregate_type} of '{headers.aggregate_type}': the event has no header "
        "'aggregate_type'"
    )
    assert results[3] == "event server target 'remote': not sent, behind seq 2 of its key"
    assert refusal == results[1]
    stored = _events(server, ("orders", "*"))
    assert [(e.type, json.loads(e.payload)["n"]) for e in stored] == [
        (("orders", "order", "Created"), 1),
        (("orders", "invoice", "Created"), 3),
    ]


def test_a_template_filled_to_the_reserved_consumer_prefix_fails_alone(server) -> None:
    """Only the event servers write stream consumer events: a template that makes one from
    an event's header refuses that event, the others go on."""
    config = EventServerTargetConfig(
        kind="event_server",
        address=server.eventer,
        timeout="3s",
        type_template=["{headers.area}", "stream", "consumer", "{event_type}"],
    )
    target = EventServerTarget("remote", config)
    events = [_typed_event(1, "a", {"area": "tidings"}), _typed_event(2, "b", {"area": "shop"})]
    try:
        results = target.publish(events)
    finally:
        target.close()
    assert results[0] is not None and "reserved prefix tidings/stream/consumer" in results[0]
    assert results[1] is None
    assert [e.type for e in _events(server, ("?", "stream", "*"))] == [
        ("shop", "stream", "consumer", "Created")
    ]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"type_template": ["orders", "{aggregate_type}"]}, "unknown placeholder"),
        ({"type_template": ["orders", "*"]}, "segment '*' is a query wildcard"),
        ({"type_template": []}, "at least one segment"),
        ({"type_template": ["{event_type}"], "type_prefix": ["t"]}, "not both"),
        (
            {"type_template": ["tidings", "stream", "consumer", "{event_type}"]},
            "type_template ['tidings', 'stream', 'consumer'] makes types under the reserved "
            "prefix tidings/stream/consumer",
        ),
        ({"type_prefix": ["tidings", "stream", "consumer", "x"]}, "reserved prefix"),
    ],
)
def test_a_bad_type_template_is_a_config_error_naming_it(entry: dict, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config({"targets": {"remote": {"kind": "event_server", **entry}}})

    assert "targets.remote" in str(raised.value) and message in str(raised.value)


def test_publishing_over_mutual_tls_and_a_server_the_target_cannot_verify(
    tmp_path: Path,
) -> None:
    """The target verifies the server (its CA, the address's host) and presents the relay's
    certificate; a server it cannot verify makes it unavailable, saying why."""
    setup = TlsSetup(tmp_path / "pki")
    ports = {"eventer": free_port(), "syncer": free_port()}
    address = local_address(ports["eventer"], "ssl+sbs")
    tls = setup.server_tls(mutual=True).model_dump()
    process = ServerProcess.tidings(
        tmp_path / "server", 1, ports, eventer={"address": address, "tls": tls}
    )
    process.start()
    try:
        relay_tls = setup.client_tls("relay")
        config = EventServerTargetConfig(
            kind="event_server", address=address, type_prefix=["t"], timeout="3s", tls=relay_tls
        )
        target = EventServerTarget("remote", config)
        try:
            assert target.publish([_outbox_event(n) for n in range(3)]) == [None] * 3
        finally:
            target.close()

        async def stored() -> list[StoredEvent]:
            async with await connect(address, tls=setup.client_tls("reader")) as client:
                return await client.query(QueryData(event_types=(("t", "*"),)))

        assert len(run(stored())) == 3
        stranger = TestCA(tmp_path / "other", "other")
        untrusting = EventServerTargetConfig(
            kind="event_server",
            address=address,
            timeout="3s",
            failover_wait="300ms",
            tls=TlsClientConfig(ca_file=str(stranger.cert)),
        )
        target = EventServerTarget("remote", untrusting)
        try:
            with pytest.raises(TargetUnavailable, match="certificate is refused"):
                target.publish([_outbox_event(9)])
        finally:
            target.close()
    finally:
        process.stop()
