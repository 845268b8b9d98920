"""The rabbitmq (AMQP 0-9-1) target against the real RabbitMQ on 127.0.0.1:5672: what only
this kind does (message properties, the default exchange, mandatory routing, frame sizes,
declaring exchanges, several servers, users, the broker stopped under traffic). The contract
every kind keeps is checked in ``tests/targets/contract/``.

Each test declares its own exchange and queues (unique names) and deletes them afterwards.
The outage test stops RabbitMQ's application with ``rabbitmqctl stop_app`` and starts it
again in a ``finally``, so the shared broker is never left down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

import tidings.targets.registry  # noqa: F401 - enters the target kinds into the config
from bench.harness.processes import free_port
from tests.support.certificates import TestCA
from tests.support.helpers import relay_config, statuses
from tests.targets.kinds.rabbitmq_support import (
    Topology,
    broker_user,
    headers,
    messages,
    start_broker,
    stop_broker,
)
from tests.targets.makers import target_config, target_maker
from tests.targets.outbox_events import event, full_event
from tidings.db import make_engine
from tidings.errors import (
    ConfigError,
    EmitError,
    TargetCallFailed,
    TargetUnavailable,
)
from tidings.events.outbox import OutboxEvent
from tidings.outbox.schema import outbox_event
from tidings.pipeline.publishing.breaker import MAX_PAUSE_S
from tidings.pipeline.relay_query import start_relay
from tidings.pipeline.replay import ReplayLimits, run_replay
from tidings.targets.kinds.rabbitmq.config import RabbitMQTargetConfig
from tidings.targets.kinds.rabbitmq.target import RabbitMQTarget
from tidings.targets.registry import build_target
from tidings.targets.routed import outbox_from_config


@pytest.fixture
def topology() -> Iterator[Topology]:
    made = Topology()
    yield made
    made.remove()


@pytest.fixture
def make_target(topology: Topology) -> Iterator[Callable[..., RabbitMQTarget]]:
    """Targets on the test's exchange, closed afterwards."""
    yield from target_maker(
        lambda entry: RabbitMQTarget("rmq-test", RabbitMQTargetConfig(**entry)),
        {"kind": "rabbitmq", "exchange": topology.exchange, "confirm_timeout": "3s"},
    )


def seqs(queue: str) -> list[int]:
    return [int(headers(m)["Tidings-Seq"]) for m in messages(queue)]


# -- messages -------------------------------------------------------------------------------


def test_messages_arrive_persistent_with_message_id_headers_and_body(
    make_target: Callable[..., RabbitMQTarget], topology: Topology
) -> None:
    topology.declare_exchange()
    queue = topology.queue("order.#")
    full = full_event(1, {"X-Tenant": "acme", "tidings-seq": "forged", "BCC": "elsewhere"})
    bare = event(2, event_type="order.paid")

    assert make_target().publish([full, bare]) == [None, None]

    first, second = messages(queue)
    assert first.routing_key == "order.created" and first.exchange == topology.exchange
    assert first.body == '{"id": 1, "name": "Grüße"}'.encode()
    properties = first.header.properties
    assert properties.message_id == full.event_id
    assert properties.correlation_id == "corr-1"
    assert properties.delivery_mode == 2
    assert properties.content_type == "application/json"
    assert headers(first) == {
        "X-Tenant": "acme",
        "Tidings-Event-Type": "order.created",
        "Tidings-Event-Version": "2",
        "Tidings-Seq": "1",
        "Tidings-Logged-At": "2024-05-17T09:30:15.123456+00:00",
        "Tidings-Correlation-Id": "corr-1",
        "Tidings-Originator": "shop",
        "Tidings-Partition-Key": "order-1",
    }
    assert second.routing_key == "order.paid"
    assert second.header.properties.message_id == bare.event_id


def test_the_default_exchange_routes_to_the_queue_the_key_names(
    make_target: Callable[..., RabbitMQTarget], topology: Topology
) -> None:
    queue = topology.queue(exchange="")

    target = make_target(exchange="", routing_key=queue)

    assert target.publish([event(1), event(2)]) == [None, None]
    assert seqs(queue) == [1, 2]


def test_not_persistent_when_configured(
    make_target: Callable[..., RabbitMQTarget], topology: Topology
) -> None:
    topology.declare_exchange()
    queue = topology.queue()

    assert make_target(persistent=False).publish([event(1)]) == [None]

    (message,) = messages(queue)
    assert message.header.properties.delivery_mode == 1


# -- unroutable, oversize headers ------------------------------------------------------------


def test_without_mandatory_an_unroutable_message_is_confirmed_and_dropped(
    make_target: Callable[..., RabbitMQTarget], topology: Topology
) -> None:
    topology.declare_exchange()
    queue = topology.queue("order.*")

    assert make_target(mandatory=False).publish([event(1, event_type="invoice.sent")]) == [None]
    assert messages(queue) == []


def test_headers_too_large_for_one_frame_are_refused_alone(
    make_target: Callable[..., RabbitMQTarget], topology: Topology
) -> None:
    topology.declare_exchange()
    queue = topology.queue()
    target = make_target()
    heavy = event(2, headers={f"h{n}": "v" * 1000 for n in range(200)})

    results = target.publish([event(1), heavy, event(3)])

    assert results[1] is not None and "over the connection's frame_max of 131072" in results[1]
    assert results[1] == target.refusal(heavy)
    assert seqs(queue) == [1, 3]


# -- the exchange --------------------------------------------------------------------------------


def test_a_missing_exchange_makes_the_target_unavailable_until_it_exists(
    make_target: Callable[..., RabbitMQTarget], topology: Topology
) -> None:
    target = make_target()

    with pytest.raises(TargetUnavailable) as raised:
        target.publish([event(1)])

    assert f"exchange '{topology.exchange}' does not exist" in str(raised.value)
    topology.declare_exchange()
    queue = topology.queue()
    assert target.publish([event(1)]) == [None]
    assert seqs(queue) == [1]


def test_exchange_type_declares_a_missing_exchange_and_refuses_another_type(
    make_target: Callable[..., RabbitMQTarget], topology: Topology
) -> None:
    topology.exchanges.append(topology.exchange)  # the target makes it; the test removes it
    assert make_target(exchange_type="topic", mandatory=False).publish([event(1)]) == [None]
    queue = topology.queue("order.*")
    assert make_target(exchange_type="topic").publish([event(2)]) == [None]
    assert seqs(queue) == [2]

    with pytest.raises(TargetUnavailable, match="exists with other settings than type 'direct'"):
        make_target(exchange_type="direct").publish([event(3)])


# -- outages, credentials, TLS -----------------------------------------------------------------


def test_the_next_server_is_tried_when_the_first_is_down(
    make_target: Callable[..., RabbitMQTarget], topology: Topology
) -> None:
    topology.declare_exchange()
    queue = topology.queue()
    down = f"amqp://127.0.0.1:{free_port()}/"

    assert make_target(servers=[down, "amqp://127.0.0.1:5672/"]).publish([event(1)]) == [None]
    assert seqs(queue) == [1]


def test_username_and_password_log_in_and_wrong_ones_are_refused(
    make_target: Callable[..., RabbitMQTarget], topology: Topology
) -> None:
    topology.declare_exchange()
    queue = topology.queue()
    user = f"tidings-test-{topology.tag}"
    with broker_user(user, "s3cret-pw"):
        assert make_target(username=user, password="s3cret-pw").publish([event(1)]) == [None]
        with pytest.raises(TargetUnavailable) as raised:
            make_target(username=user, password="wrong-pw").publish([event(2)])
    assert "ACCESS_REFUSED" in str(raised.value) or "Authentication" in str(raised.value)
    assert "wrong-pw" not in str(raised.value)
    assert seqs(queue) == [1]


def test_tls_to_a_broker_that_speaks_plain_amqp_fails_as_unavailable(
    make_target: Callable[..., RabbitMQTarget], tmp_path: Path
) -> None:
    """No TLS listener runs on the shared broker: the handshake fails, and the target says
    it cannot connect (the TLS options are loaded and used)."""
    ca = TestCA(tmp_path)
    target = make_target(servers=["amqps://127.0.0.1:5672/"], tls={"ca_file": str(ca.cert)})

    with pytest.raises(TargetUnavailable, match="cannot connect"):
        target.publish([event(1)])


@pytest.mark.slow
def test_the_broker_stopped_and_started_under_traffic_loses_nothing_and_keeps_order(
    make_target: Callable[..., RabbitMQTarget], topology: Topology
) -> None:
    """A relay's loop in miniature (the relay's own tests cover its side): calls of 20 keys,
    new events coming all along, each key's unconfirmed events sent again in order after a
    failure, while RabbitMQ's application is stopped and started. Every event is in the
    durable queue, each key's first copies in log order (a message whose confirm was lost
    with the connection may be there twice: at-least-once)."""
    topology.declare_exchange()
    queue = topology.queue()
    target = make_target(confirm_timeout="2s")
    keys = [f"k{n}" for n in range(20)]
    pending: dict[str, list[OutboxEvent]] = {key: [] for key in keys}
    logged: dict[str, list[int]] = {key: [] for key in keys}
    seq = outages = 0
    stopper = threading.Thread(target=stop_broker)
    restarted = False
    try:
        deadline = time.monotonic() + 180
        while not restarted or any(pending.values()):
            assert time.monotonic() < deadline, "the target did not recover"
            if not restarted:  # traffic goes on until the broker is back
                for key in keys:
                    seq += 1
                    pending[key].append(event(seq, partition_key=key))
                    logged[key].append(seq)
                if seq == 400:
                    stopper.start()
            batch = [e for key in keys for e in pending[key][:5]]
            try:
                results = target.publish(batch)
            except (TargetUnavailable, TargetCallFailed) as exc:
                outages += 1
                confirmed = getattr(exc, "confirmed", None) or [False] * len(batch)
                results = [None if ok else "failed" for ok in confirmed]
                if not restarted:
                    stopper.join()
                    start_broker()
                    restarted = True
            for e, result in zip(batch, results, strict=True):
                if result is None:  # confirmed; anything else goes again, in order
                    pending[e.partition_key or ""].remove(e)
    finally:
        if stopper.is_alive() or stopper.ident is not None:
            stopper.join()
        start_broker()

    assert outages >= 1
    stored = [(headers(m)["Tidings-Partition-Key"], int(headers(m)["Tidings-Seq"]))
              for m in messages(queue)]  # fmt: skip
    for key in keys:
        assert list(dict.fromkeys(s for k, s in stored if k == key)) == logged[key]


# -- configuration -----------------------------------------------------------------------------


def rabbitmq_config(tmp_path: Path | None = None, **entry: Any) -> Any:
    return target_config("rmq", {"kind": "rabbitmq", "exchange": "events", **entry}, tmp_path)


def test_a_configuration_builds_the_target_through_the_registry() -> None:
    config = rabbitmq_config(routing_key="orders.{event_type}", exchange_type="topic")

    target = build_target("rmq", config)

    assert isinstance(target, RabbitMQTarget)
    assert config.servers == ["amqp://127.0.0.1:5672/"] and config.mandatory


def test_a_missing_tls_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        rabbitmq_config(tmp_path, servers=["amqps://h:5671/"], tls={"ca_file": "ca.pem"})

    assert f"tls.ca_file file '{tmp_path / 'ca.pem'}' does not exist" in str(raised.value)


def test_the_password_is_never_shown_in_a_configuration_error() -> None:
    with pytest.raises(ConfigError) as raised:
        rabbitmq_config(password="hunter2-secret", confirm_timeout="soon")

    assert "hunter2-secret" not in str(raised.value)


# -- through the relay, from configuration -------------------------------------------------------


@pytest.mark.spark
def test_the_relay_publishes_from_configuration_and_fails_only_the_unroutable_event(
    spark: Any, topology: Topology, tmp_path: Path
) -> None:
    """The relay (Spark) with a ``rabbitmq`` target from configuration: a routed outbox
    refuses an oversize event at emit; of what was logged, the event no queue takes is
    FAILED with the exchange and routing key named, the others are PUBLISHED and queued in
    their keys' order. The oversize event is never logged, so seqs count from 1 after it."""
    topology.declare_exchange()
    queue = topology.queue("Created.eu")
    target = {
        "kind": "rabbitmq",
        "exchange": topology.exchange,
        "routing_key": "{event_type}.{payload.data.region}",
        "max_message_size": 4096,
        "confirm_timeout": "3s",
    }
    config = relay_config(tmp_path, targets={"rmq": target}, routes={"Created": ["rmq"]})
    engine = make_engine(config.database.url)
    outbox = outbox_from_config(config, engine)
    too_big = {"region": "eu", "blob": "x" * 5000}
    with pytest.raises(EmitError, match="over the broker's max_message_size of 4096"):  # noqa: SIM117
        with outbox.transaction() as tx:
            tx.emit("Created", too_big, partition_key="k0")
    for n, (key, region) in enumerate([("k1", "eu"), ("k2", "eu"), ("k3", "us"), ("k1", "eu")]):
        with outbox.transaction() as tx:
            tx.emit("Created", {"n": n, "region": region}, partition_key=key)
    with outbox.transaction() as tx:
        tx.emit("Created", {"n": 4, "region": "eu"}, partition_key="k2")

    start_relay(spark, config, available_now=True).awaitTermination()

    assert statuses(engine) == {
        1: "PUBLISHED", 2: "PUBLISHED", 3: "FAILED", 4: "PUBLISHED", 5: "PUBLISHED",
    }  # fmt: skip
    with engine.connect() as conn:
        error = conn.execute(
            select(outbox_event.c.error_details).where(outbox_event.c.seq == 3)
        ).scalar_one()
    assert (
        f"unroutable: no queue is bound to exchange '{topology.exchange}' for routing key "
        "'Created.us'" in error
    )
    stored = [(headers(m)["Tidings-Partition-Key"], int(headers(m)["Tidings-Seq"]))
              for m in messages(queue)]  # fmt: skip
    assert [s for k, s in stored if k == "k1"] == [1, 4]
    assert [s for k, s in stored if k == "k2"] == [2, 5]
    assert len(stored) == 4


@pytest.mark.slow
@pytest.mark.spark
def test_the_relay_holds_events_while_the_broker_is_stopped_then_delivers_them_in_order(
    spark: Any, topology: Topology, tmp_path: Path
) -> None:
    """RabbitMQ stopped (``rabbitmqctl stop_app``) when the relay runs: the target is down
    for the relay, so no event is charged a retry or FAILED; they wait HELD with the reason
    and, once the broker is back, a replay delivers every one, each key in log order."""
    topology.declare_exchange()
    queue = topology.queue()
    target = {"kind": "rabbitmq", "exchange": topology.exchange, "confirm_timeout": "2s"}
    config = relay_config(tmp_path, targets={"rmq": target}, routes={"Created": ["rmq"]})
    engine = make_engine(config.database.url)
    outbox = outbox_from_config(config, engine)
    for n in range(12):
        with outbox.transaction() as tx:
            tx.emit("Created", {"n": n}, partition_key=f"k{n % 3}")
    stop_broker()
    try:
        start_relay(spark, config, available_now=True).awaitTermination()
        with engine.connect() as conn:
            rows = conn.execute(select(outbox_event).order_by(outbox_event.c.seq)).all()
        assert {r.status for r in rows} <= {"HELD", "PENDING"}
        assert all(r.retry_count == 0 for r in rows)
        assert any("cannot connect" in (r.error_details or "") for r in rows)
    finally:
        start_broker()
    time.sleep(MAX_PAUSE_S + 0.5)  # the breaker's longest pause: a probe is due now
    limits = ReplayLimits.from_config(config)
    run_replay(spark, config, limits=replace(limits, older_than=timedelta(0)))

    assert set(statuses(engine).values()) == {"PUBLISHED"}
    stored = [(headers(m)["Tidings-Partition-Key"], int(headers(m)["Tidings-Seq"]))
              for m in messages(queue)]  # fmt: skip
    for k in range(3):
        assert [s for key, s in stored if key == f"k{k}"] == list(range(k + 1, 13, 3))
