"""The contract every target kind keeps (issue 31), checked against each kind's real broker:
confirmation per event, headers carried, destination templates, a refused event failing
alone and stopping only its key, per-key order across rounds, calls from many threads, an
unreachable broker as unavailable, size limits checked at emit, configuration errors, a
closed target staying closed, and the relay publishing from configuration.

What only one kind does (MQTT's retained messages, Redis's MAXLEN, a webhook's Retry-After,
JetStream's de-duplication, RabbitMQ's exchanges) is in that kind's own file under
``tests/targets/kinds/``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tests.support.brokers import Traffic, first_seen_order
from tests.support.helpers import relay_config, statuses
from tests.targets.contract.conftest import KINDS, kind_params
from tests.targets.contract.harness import NAME, KindHarness, config_entry
from tests.targets.outbox_events import event
from tidings.db import make_engine
from tidings.errors import ConfigError, TargetError, TargetUnavailable
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.pipeline.relay_query import start_relay

NOT_SENT = "not sent: event seq 2 of its key failed before it in this call"


def by_key(found: list[Any]) -> dict[str | None, list[int]]:
    """Each key's ``n``s in the order the broker holds them."""
    order: dict[str | None, list[int]] = {}
    for delivered in found:
        order.setdefault(delivered.key, []).append(delivered.n)
    return order


# -- confirmation, headers, destinations -------------------------------------------------------


def test_each_event_is_confirmed_and_arrives_with_its_id_key_and_headers(
    kind: KindHarness,
) -> None:
    sent = [
        event(1, partition_key="order-1", headers={"tenant": "acme"}),
        event(2, partition_key="order-2"),
        event(3, partition_key="order-1", headers={"tenant": "globex", "region": "eu"}),
    ]

    assert kind.make().publish(sent) == [None, None, None]

    found = kind.delivered(3)
    assert [(d.event_id, d.key, d.n) for d in found] == [
        (e.event_id, e.partition_key, e.seq) for e in sent
    ]
    assert [d.headers for d in found] == [
        {"tenant": "acme"},
        {},
        {"tenant": "globex", "region": "eu"},
    ]
    assert len({d.destination for d in found}) == 1


def test_destinations_come_from_a_header_and_a_payload_field(kind: KindHarness) -> None:
    target = kind.make(**kind.with_template(kind.template("{headers.area}", "{payload.region}")))
    eu = event(1, headers={"area": "orders"}, payload='{"n": 1, "region": "eu"}')
    us = event(2, headers={"area": "orders"}, payload='{"n": 2, "region": "us"}')

    assert target.publish([eu, us]) == [None, None]

    found = {d.event_id: d.destination for d in kind.delivered(2)}
    assert found == {
        eu.event_id: kind.destination("orders", "eu"),
        us.event_id: kind.destination("orders", "us"),
    }


def test_an_event_whose_destination_cannot_be_filled_fails_alone_and_is_refused_at_emit(
    kind: KindHarness,
) -> None:
    template = kind.template("{headers.kind}")
    target = kind.make(**kind.with_template(template))
    good, missing = event(1, headers={"kind": "orders"}), event(2)
    last = event(4, headers={"kind": "orders"})
    bad = [event(3, headers={"kind": kind.bad_value[0]})] if kind.bad_value else []

    results = target.publish([good, missing, *bad, last])

    assert results[0] is None and results[-1] is None
    assert results[1] == (
        f"{kind.kind} target '{NAME}': no {kind.destination_word} for event "
        f"{missing.event_id} (seq 2): placeholder {{headers.kind}} of '{template}': the event "
        "has no header 'kind'"
    )
    if kind.bad_value:
        assert results[2] is not None and kind.bad_value[1] in results[2]
        assert target.refusal(bad[0]) == results[2]
    assert target.refusal(missing) == results[1]  # a routed outbox refuses it at emit
    assert target.refusal(good) is None
    found = kind.delivered(2)
    assert [(d.n, d.destination) for d in found] == [
        (1, kind.destination("orders")),
        (4, kind.destination("orders")),
    ]


# -- refusals and order ------------------------------------------------------------------------


def test_a_refused_event_fails_alone_and_stops_only_its_key(kind: KindHarness) -> None:
    """Several events of a key in one call go one round after another: the one the broker
    (or the target) refuses fails with the reason, its key's later events are not sent, the
    other key's are stored in order, and the target goes on serving."""
    target = kind.make()
    poison, reason = kind.poison(2, "k1")
    k1 = [event(1, partition_key="k1"), poison, event(3, partition_key="k1")]
    k2 = [event(seq, partition_key="k2") for seq in (4, 5, 6)]

    results = target.publish([k1[0], k2[0], k1[1], k2[1], k1[2], k2[2]])

    assert [results[i] for i in (0, 1, 3, 5)] == [None] * 4
    assert results[2] is not None and reason in results[2]
    assert results[4] == NOT_SENT
    if kind.poison_refused_at_emit:
        assert target.refusal(poison) == results[2]
    assert target.publish([event(7, partition_key="k3")]) == [None]  # still serving
    assert by_key(kind.delivered(5)) == {"k1": [1], "k2": [4, 5, 6], "k3": [7]}


def test_a_key_s_events_arrive_in_log_order_across_rounds_and_calls(kind: KindHarness) -> None:
    """The longest run of one key the relay gives a call (the target's ``events_per_key``)
    and three keys interleaved with it in one call (each key's events go in rounds, one
    waiting for the confirmation of the one before), then calls of one event per key."""
    target = kind.make()
    length = target.events_per_key
    run = [event(seq, partition_key="only") for seq in range(1, length + 1)]
    mixed = [event(seq, partition_key=f"k{seq % 3}") for seq in range(length + 1, length + 61)]
    first_call = [*(e for pair in zip(run, mixed, strict=False) for e in pair), *run[60:]]

    assert target.publish(first_call) == [None] * (length + 60)
    seq = length + 60
    for _ in range(5):
        call = [event(seq := seq + 1, partition_key=f"key-{k}") for k in range(10)]
        assert target.publish(call) == [None] * 10

    order = by_key(kind.delivered(length + 110))
    assert order["only"] == list(range(1, length + 1))
    for k in range(3):
        assert order[f"k{k}"] == [s for s in range(length + 1, length + 61) if s % 3 == k]
    for k in range(10):
        assert order[f"key-{k}"] == [length + 61 + k + 10 * call for call in range(5)]


def test_publishing_from_many_threads_at_once(kind: KindHarness) -> None:
    """Calls from several threads (Spark's tasks) share one target."""
    target = kind.make()
    results: list[list[str | None]] = []

    def publish(base: int) -> None:
        results.append(target.publish([event(base + i) for i in range(200)]))

    threads = [threading.Thread(target=publish, args=(n * 1000,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert [r for batch in results for r in batch] == [None] * 800
    assert len({d.event_id for d in kind.delivered(800)}) == 800


# -- sizes -------------------------------------------------------------------------------------


def test_an_event_over_the_size_limit_fails_alone_and_is_refused_at_emit(
    kind: KindHarness,
) -> None:
    with kind.sized() as sized:
        target, big = sized.target, sized.big
        before = target.refusal(big)

        results = target.publish([event(1), big, event(3)])

        assert results[0] is None and results[2] is None
        assert results[1] is not None
        for fragment in sized.fragments:
            assert fragment in results[1]
        assert target.refusal(big) == results[1]  # known now, whether or not before
        assert before == (results[1] if sized.known_before_publish else None)
        assert target.refusal(event(4)) is None
        assert target.publish([event(5)]) == [None]  # the connection was not broken
        if sized.delivered is not None:
            assert [d.n for d in sized.delivered()] == [1, 3, 5]


# -- outages and lifecycle ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", kind_params(lambda h: h.restartable), indirect=True)
def test_the_broker_stopped_and_restarted_under_traffic_loses_nothing_and_keeps_order(
    kind: KindHarness,
) -> None:
    """A private broker is stopped twice while events of 20 keys are being published as the
    relay would (what failed is sent again), and started again: every event is there, and
    a consumer dropping event ids it has seen reads each key's events in log order."""
    with kind.outage() as outage:
        events = [event(seq, partition_key=f"k{seq % 20}") for seq in range(1, outage.events + 1)]
        traffic = Traffic(outage.target, events)
        traffic.start()
        for share in (0.3, 0.6):  # stopped while events are still flowing
            traffic.wait_until(share)
            outage.restart()
        traffic.join(180)
        assert traffic.error is None and traffic.failed_calls >= 1  # the stops were felt
        ids = {e.event_id for e in events}
        found = outage.delivered(ids)
    assert {d.event_id for d in found} == ids
    order = first_seen_order([(d.event_id, d.key or "", d.n) for d in found])
    assert all(seqs == sorted(seqs) and len(seqs) == len(events) // 20 for seqs in order.values())


def test_an_unreachable_broker_is_unavailable_and_an_empty_call_needs_none(
    kind: KindHarness,
) -> None:
    target = kind.make(**kind.unreachable())

    with pytest.raises(TargetUnavailable) as raised:
        target.publish([event(1, partition_key="a"), event(2, partition_key="b")])

    assert f"'{NAME}'" in str(raised.value) and kind.unreachable_text in str(raised.value)
    assert target.publish([]) == []
    assert kind.make(**kind.unreachable()).publish([]) == []  # never connected


def test_close_is_final_and_idempotent(kind: KindHarness) -> None:
    target = kind.make()
    assert target.publish([event(1)]) == [None]
    if kind.loop_thread is not None:
        assert kind.loop_thread in {t.name for t in threading.enumerate()}

    target.close()
    target.close()

    if kind.loop_thread is not None:
        assert kind.loop_thread not in {t.name for t in threading.enumerate()}
    with pytest.raises(TargetError, match=f"{kind.kind} target '{NAME}' is closed"):
        target.publish([event(2)])


# -- configuration -----------------------------------------------------------------------------


def bad_configurations() -> list[Any]:
    """Every kind's bad entries, and for each kind a template with an unknown placeholder."""
    cases = []
    for harness in KINDS:
        unknown = (harness.with_template("t.{aggregate}"), "unknown placeholder {aggregate}")
        for n, (entry, message) in enumerate([unknown, *harness.bad_entries]):
            cases.append(pytest.param(harness, entry, message, id=f"{harness.kind}-{n}"))
    return cases


@pytest.mark.parametrize(("harness", "entry", "message"), bad_configurations())
def test_a_bad_configuration_is_a_config_error_naming_it(
    harness: type[KindHarness], entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        config_entry({"kind": harness.kind, **harness.minimal_entry, **entry})

    assert f"targets.{NAME}" in str(raised.value) and message in str(raised.value)


# -- through the relay -------------------------------------------------------------------------


@pytest.mark.spark
def test_the_relay_delivers_from_configuration_and_fails_only_the_event_without_a_destination(
    kind: KindHarness, spark: Any, tmp_path: Path
) -> None:
    """The relay (Spark) with the kind's target from configuration: the event whose payload
    cannot fill the destination template is FAILED with the reason, the others are
    PUBLISHED to the destinations their payloads name."""
    template = kind.template("orders", "{payload.data.region}")
    entry = {"kind": kind.kind, **kind.settings(), **kind.with_template(template)}
    config = relay_config(
        tmp_path, targets={NAME: entry}, routes={"Created": [NAME]}, retry={"backoff": ["1ms"]}
    )
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)  # no routed targets: the relay meets the bad event
    for n, region in enumerate(["eu", None, "eu", "us"]):
        with outbox.transaction() as tx:
            tx.emit("Created", {"n": n, "region": region}, partition_key=f"k{n}")

    start_relay(spark, config, available_now=True).awaitTermination()

    assert statuses(engine) == {1: "PUBLISHED", 2: "FAILED", 3: "PUBLISHED", 4: "PUBLISHED"}
    with engine.connect() as conn:
        error = conn.execute(
            select(outbox_event.c.error_details).where(outbox_event.c.seq == 2)
        ).scalar_one()
    assert f"no {kind.destination_word} for event" in error
    assert "placeholder {payload.data.region}" in error
    assert "the payload has no field 'data.region'" in error
    eu, us = kind.destination("orders", "eu"), kind.destination("orders", "us")
    assert sorted((d.destination, d.n) for d in kind.delivered(3)) == [(eu, 0), (eu, 2), (us, 3)]
