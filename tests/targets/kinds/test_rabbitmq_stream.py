"""The rabbitmq_stream target against the real RabbitMQ stream protocol on 127.0.0.1:5552.

Each test has its own stream (a unique name, deleted afterwards) and its own outbox log (a
SQLite file), whose events the target publishes; the stream is read back with rstream's
own ``Consumer``. The outage test stops RabbitMQ's application with ``rabbitmqctl stop_app``
and starts it again in a ``finally``; the crash test SIGKILLs real ``tidings relay``
processes.
"""

from __future__ import annotations

import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rstream import amqp_decoder
from sqlalchemy import Engine, func, select

import tidings.targets.registry  # noqa: F401 - enters the target kinds into the config
from bench.harness.processes import kill_tree, tidings_cli
from tests.support.certificates import TestCA
from tests.support.helpers import relay_config, write_config
from tests.support.waiting import wait_until
from tests.targets.kinds.rabbitmq_stream_support import (
    StallingProxy,
    admin,
    delete_streams,
    read_stream,
    stream_name,
    wait_for_streams,
)
from tests.targets.kinds.rabbitmq_support import broker_user, start_broker, stop_broker
from tidings.config import load_config
from tidings.db import make_engine
from tidings.errors import ConfigError, EmitError, TargetCallFailed, TargetUnavailable
from tidings.events.outbox import OutboxEvent
from tidings.events.timeutil import utcnow
from tidings.outbox.confirmations import ConfirmationLog
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import (
    OUTBOX_EVENT_COLUMNS,
    ensure_schema,
    outbox_event,
    outbox_event_from_row,
    stream_producer,
)
from tidings.outbox.stream_ids import StreamIds
from tidings.targets.kinds.rabbitmq_stream.config import RabbitMQStreamTargetConfig
from tidings.targets.kinds.rabbitmq_stream.messages import message
from tidings.targets.kinds.rabbitmq_stream.target import RabbitMQStreamTarget
from tidings.targets.registry import build_target
from tidings.targets.routed import outbox_from_config


@pytest.fixture
def stream() -> Iterator[str]:
    name = stream_name()
    yield name
    admin("delete", name)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    ensure_schema(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def make_target(stream: str, log: Engine) -> Iterator[Callable[..., RabbitMQStreamTarget]]:
    """Targets on the test's stream with the test's log attached, closed afterwards."""
    built: list[RabbitMQStreamTarget] = []

    def make(**overrides: Any) -> RabbitMQStreamTarget:
        settings: dict[str, Any] = {
            "kind": "rabbitmq_stream",
            "stream": stream,
            "create_stream": True,
            "confirm_timeout": "2s",
            "producer_lease": "3s",
        }
        settings.update(overrides)
        target = RabbitMQStreamTarget("rs-test", RabbitMQStreamTargetConfig(**settings))
        target.attach_log(ConfirmationLog(log))
        built.append(target)
        return target

    yield make
    for target in built:
        target.close()


def emit(engine: Engine, count: int, keys: int = 3, **fields: Any) -> list[OutboxEvent]:
    """``count`` events logged (key ``k<n % keys>``), read back as the relay reads them."""
    with Outbox(engine).transaction() as tx:
        for n in range(count):
            tx.emit("Created", {"n": n}, partition_key=f"k{n % keys}", **fields)
    return logged(engine)


def logged(engine: Engine) -> list[OutboxEvent]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(*(outbox_event.c[name] for name in OUTBOX_EVENT_COLUMNS)).order_by(
                outbox_event.c.seq
            )
        )
        return [outbox_event_from_row(*row) for row in rows]


def assert_once_in_order(stream: str, events: list[OutboxEvent]) -> None:
    """Every event in the stream exactly once, each key's in log order."""
    found = read_stream(stream, len(events))
    assert sorted(r.message_id for r in found) == sorted(e.event_id for e in events)
    by_key: dict[str, list[int]] = {}
    for read in found:
        by_key.setdefault(read.key, []).append(read.seq)
    for seqs in by_key.values():
        assert seqs == sorted(seqs)


# -- messages -------------------------------------------------------------------------------


def test_events_are_confirmed_and_stored_with_their_id_properties_and_headers(
    make_target: Callable[..., RabbitMQStreamTarget], log: Engine, stream: str
) -> None:
    events = emit(log, 9, headers={"tenant": "acme", "Tidings-Seq": "forged"})
    target = make_target()

    assert target.publish(events) == [None] * 9

    found = read_stream(stream, 9)
    assert [r.seq for r in found] == list(range(1, 10))  # log order across keys too
    first = found[0]
    assert first.message_id == events[0].event_id
    assert first.body == events[0].payload.encode()
    assert first.properties["tenant"] == "acme"
    assert first.properties["Tidings-Seq"] == "1"  # the target's own header wins
    assert first.properties["Tidings-Event-Type"] == "Created"
    assert first.properties["Tidings-Partition-Key"] == "k0"


def test_a_message_is_what_rstreams_own_decoder_reads() -> None:
    """The target's own AMQP 1.0 encoding, read by rstream's decoder: every property, short
    and long strings (str8 and str32), non-ASCII text, the body as it was."""
    logged_at = datetime(2024, 5, 17, 9, 30, 15, 123456, tzinfo=UTC)
    event = OutboxEvent(
        seq=7,
        event_id=uuid.uuid4().hex,
        event_type="Créé",
        payload='{"name": "Zoë"}',
        logged_at=logged_at,
        correlation_id="corr-1",
        partition_key="k" * 300,
        headers={"long": "v" * 70_000},
    )

    decoded = amqp_decoder(message(event))

    assert decoded.body == b'{"name": "Zo\xc3\xab"}'
    props = decoded.properties
    assert props.message_id == event.event_id.encode()
    assert props.correlation_id == b"corr-1"
    assert props.content_type == b"application/json"
    assert props.creation_time == int(logged_at.timestamp() * 1000)
    application = {k.decode(): v.decode() for k, v in decoded.application_properties.items()}
    assert application["long"] == "v" * 70_000
    assert application["Tidings-Partition-Key"] == "k" * 300
    assert application["Tidings-Event-Type"] == "Créé"
    assert application["Tidings-Seq"] == "7"
    no_correlation = amqp_decoder(message(replace(event, correlation_id=None)))
    assert no_correlation.properties.correlation_id is None


def test_events_published_again_are_confirmed_without_being_stored_twice(
    make_target: Callable[..., RabbitMQStreamTarget], log: Engine, stream: str
) -> None:
    """The relay publishes again what it could not record (a crash after the confirm): the
    same target, and a new one (a restarted relay) after the first gave its reference back."""
    events = emit(log, 10)
    first = make_target()
    assert first.publish(events[:6]) == [None] * 6
    assert first.publish(events[:3]) == [None] * 3
    first.close()

    assert make_target().publish(events[2:]) == [None] * 8

    assert_once_in_order(stream, events)


def test_a_dead_senders_reference_is_reconciled_once_its_lease_expires(
    make_target: Callable[..., RabbitMQStreamTarget], log: Engine, stream: str
) -> None:
    """A sender died holding its reference: what it sent and the broker stored is confirmed
    without sending, once its lease expired; what it recorded but never sent (its id above
    the broker's last) is sent again under a new id. Nothing twice, nothing lost."""
    events = emit(log, 12)
    dead = make_target()
    assert dead.publish(events[:6]) == [None] * 6  # stored, never recorded by the relay
    # It also numbered two more events and died before sending them (slot 0 is its own).
    ids = StreamIds(log, "rs-test")
    holder = dead._holder
    assert ids.assign(
        stream, 0, holder, 3.0, [(e.event_id, 7 + n) for n, e in enumerate(events[6:8])]
    )
    dead._senders.clear()  # it dies: no clean release (its lease runs out)

    assert make_target().publish(events) == [None] * 12

    with log.connect() as conn:  # the dead sender's slot was taken, reconciled, given back
        slots = dict(conn.execute(select(stream_producer.c.slot, stream_producer.c.holder)).all())
    assert slots[0] is None and slots[1] is not None
    assert_once_in_order(stream, events)


def publish_until_confirmed(target: RabbitMQStreamTarget, events: list[OutboxEvent]) -> None:
    """A relay's retries in miniature: ``events`` published again until every one is
    confirmed, each key's unconfirmed ones in order."""
    pending = list(events)
    deadline = time.monotonic() + 60
    while pending:
        assert time.monotonic() < deadline, "the events were not confirmed"
        try:
            results = target.publish(pending)
        except (TargetUnavailable, TargetCallFailed) as exc:
            confirmed = getattr(exc, "confirmed", None) or [False] * len(pending)
            results = [None if ok else "failed" for ok in confirmed]
            time.sleep(0.2)
        pending = [e for e, r in zip(pending, results, strict=True) if r is not None]


@pytest.mark.slow
def test_a_sender_whose_writes_stall_past_its_lease_loses_and_doubles_nothing(
    make_target: Callable[..., RabbitMQStreamTarget], log: Engine, stream: str
) -> None:
    """The broker stops reading a sender's connection mid-batch (a stalled link; a proxy
    that stops reading makes it happen): the sender's writes block with its lease running.
    Another relay process sends meanwhile; then the stalled bytes reach the broker, late.
    Each event must be in the stream once: no batch may still be on its way once its lease
    can have passed (the stalled sender gives up in time, and its reference cools down)."""
    proxy = StallingProxy()
    try:
        stalled = make_target(servers=[proxy.url], confirm_timeout="1s", producer_lease="2s")
        other = make_target(confirm_timeout="1s", producer_lease="2s")
        with Outbox(log).transaction() as tx:
            tx.emit("Created", {"n": 0}, partition_key="w")
            for n in range(40):  # about 12 MB: far more than the sockets hold
                tx.emit("Created", {"n": n, "blob": "x" * 300_000}, partition_key=f"k{n % 4}")
            for n in range(3):
                tx.emit("Created", {"n": n}, partition_key="o")
        events = logged(log)
        warm, big, small = events[:1], events[1:41], events[41:]
        assert stalled.publish(warm) == [None]  # connected, holding a reference

        proxy.stall()
        outcome: list[Any] = []

        def stalled_call() -> None:
            try:
                outcome.append(stalled.publish(big))
            except (TargetUnavailable, TargetCallFailed) as exc:
                outcome.append(exc)

        caller = threading.Thread(target=stalled_call)
        caller.start()
        time.sleep(3.5)  # past the stalled sender's lease
        assert other.publish(small[:2]) == [None, None]
        proxy.resume()  # the stalled batch reaches the broker now
        caller.join(60)
        assert not caller.is_alive()
        assert other.publish(small[2:]) == [None]

        result = outcome[0]
        if isinstance(result, list):
            unconfirmed = [e for e, r in zip(big, result, strict=True) if r is not None]
        else:
            confirmed = getattr(result, "confirmed", None) or [False] * len(big)
            unconfirmed = [e for e, ok in zip(big, confirmed, strict=True) if not ok]
        publish_until_confirmed(other, unconfirmed)

        assert_once_in_order(stream, events)
    finally:
        proxy.close()


def test_a_stream_deleted_and_created_again_takes_the_events_that_follow(
    make_target: Callable[..., RabbitMQStreamTarget], log: Engine, stream: str
) -> None:
    """An operator deletes the stream and creates it again while the target holds a
    reference on it: the broker forgot the reference's publisher and its last id. The
    target's later events go into the new stream, each once (not refused for ever through
    the old publisher, nor confirmed by what the old stream held)."""
    events = emit(log, 6)
    target = make_target(create_stream=False)
    admin("create", stream)
    assert target.publish(events[:3]) == [None] * 3
    admin("delete", stream)
    admin("create", stream)

    publish_until_confirmed(target, events[3:])

    assert_once_in_order(stream, events[3:])


@pytest.mark.slow
def test_more_streams_than_a_connection_has_publisher_ids_are_all_written(
    make_target: Callable[..., RabbitMQStreamTarget], log: Engine, stream: str
) -> None:
    """A stream per event type, 300 of them: a connection has 256 publisher ids (one byte),
    one per stream and reference. The target replaces a connection whose ids are used up;
    every event reaches its stream once (none refused for as long as the connection
    lives)."""
    with Outbox(log).transaction() as tx:
        for n in range(300):
            tx.emit(f"t{n}", {"n": n}, partition_key=f"k{n % 7}")
    events = logged(log)
    target = make_target(stream=f"{stream}.{{event_type}}")
    try:
        for start in range(0, 300, 50):
            publish_until_confirmed(target, events[start : start + 50])
        for n in (0, 255, 256, 299):
            assert [r.message_id for r in read_stream(f"{stream}.t{n}", 1)] == [events[n].event_id]
    finally:
        delete_streams(f"{stream}.")


def test_a_key_goes_in_order_and_nothing_of_it_after_an_event_that_cannot_be_sent(
    make_target: Callable[..., RabbitMQStreamTarget], log: Engine, stream: str
) -> None:
    """The stream comes from a header; an event without it fails alone, its key's later
    events are not sent, the other keys' are."""
    with Outbox(log).transaction() as tx:
        tx.emit("Created", {"n": 0}, partition_key="a", headers={"to": stream})
        tx.emit("Created", {"n": 1}, partition_key="b")  # no header: no stream
        tx.emit("Created", {"n": 2}, partition_key="b", headers={"to": stream})
        tx.emit("Created", {"n": 3}, partition_key="a", headers={"to": stream})
    events = logged(log)
    target = make_target(stream="{headers.to}")

    results = target.publish(events)

    assert results[0] is None and results[3] is None
    assert results[1] is not None and "no stream for event" in results[1]
    assert "{headers.to}" in results[1] or "headers.to" in results[1]
    assert results[2] is not None and results[2].startswith("not sent")
    assert [r.seq for r in read_stream(stream, 2)] == [1, 4]


def test_an_event_over_the_frame_size_is_refused_alone_at_emit_and_at_publish(
    make_target: Callable[..., RabbitMQStreamTarget], log: Engine, stream: str, tmp_path: Path
) -> None:
    target = make_target(frame_max=8192)
    with Outbox(log).transaction() as tx:
        tx.emit("Created", {"n": 0}, partition_key="a")
        tx.emit("Created", {"blob": "x" * 9000}, partition_key="b")
        tx.emit("Created", {"n": 2}, partition_key="c")
    events = logged(log)

    assert target.refusal(events[1]) is not None
    results = target.publish(events)

    assert results[0] is None and results[2] is None
    assert results[1] is not None and "over the connection's frame_max of 8192" in results[1]
    assert [r.seq for r in read_stream(stream, 2)] == [1, 3]
    config = relay_config(
        tmp_path,
        targets={"rs": {"kind": "rabbitmq_stream", "stream": stream, "frame_max": 8192}},
        routes={"Created": ["rs"]},
    )
    outbox = outbox_from_config(config, log)
    with pytest.raises(EmitError, match="over the connection's frame_max of 8192"):  # noqa: SIM117
        with outbox.transaction() as tx:
            tx.emit("Created", {"blob": "x" * 9000}, partition_key="b")


# -- unavailable ----------------------------------------------------------------------------


def test_a_missing_stream_makes_the_target_unavailable_until_it_exists(
    make_target: Callable[..., RabbitMQStreamTarget], log: Engine, stream: str
) -> None:
    events = emit(log, 2)
    target = make_target(create_stream=False)
    with pytest.raises(TargetUnavailable, match=f"stream '{stream}' does not exist"):
        target.publish(events)
    admin("create", stream)
    assert target.publish(events) == [None, None]


def test_an_unreachable_broker_and_a_refused_login_are_unavailable(
    make_target: Callable[..., RabbitMQStreamTarget], log: Engine
) -> None:
    events = emit(log, 1)
    with pytest.raises(TargetUnavailable, match="cannot connect"):
        make_target(servers=["rabbitmq-stream://127.0.0.1:1/"]).publish(events)
    with pytest.raises(TargetUnavailable, match="cannot connect") as refused:
        make_target(username="guest", password="not-the-password").publish(events)
    assert "not-the-password" not in str(refused.value)


def test_a_user_of_the_broker_logs_in_with_its_username_and_password(
    make_target: Callable[..., RabbitMQStreamTarget], log: Engine
) -> None:
    events = emit(log, 2)
    with broker_user("tidings-rs-test", "pw-rs-1"):
        target = make_target(username="tidings-rs-test", password="pw-rs-1")
        assert target.publish(events) == [None, None]


def test_tls_to_a_broker_that_speaks_plain_streams_fails_as_unavailable(
    make_target: Callable[..., RabbitMQStreamTarget], log: Engine, tmp_path: Path
) -> None:
    """No TLS listener runs on the shared broker: the handshake fails, and the target says
    it cannot connect (the TLS options are loaded and used)."""
    ca = TestCA(tmp_path)
    target = make_target(
        servers=["rabbitmq-stream+tls://127.0.0.1:5552/"], tls={"ca_file": str(ca.cert)}
    )
    with pytest.raises(TargetUnavailable, match="cannot connect"):
        target.publish(emit(log, 1))


def test_without_an_outbox_log_the_target_is_unavailable(stream: str) -> None:
    target = RabbitMQStreamTarget(
        "rs", RabbitMQStreamTargetConfig(kind="rabbitmq_stream", stream=stream)
    )
    event = OutboxEvent(
        seq=1, event_id=uuid.uuid4().hex, event_type="Created", payload="{}", logged_at=utcnow()
    )
    with pytest.raises(TargetUnavailable, match="no outbox log attached"):
        target.publish([event])
    assert target.publish([]) == []
    target.close()


@pytest.mark.slow
def test_the_broker_stopped_and_started_under_traffic_stores_each_event_once_in_order(
    make_target: Callable[..., RabbitMQStreamTarget], log: Engine, stream: str
) -> None:
    """A relay's loop in miniature: new events of 5 keys logged all along until the broker
    is back, each key's unconfirmed events sent again in order after a failure, while
    RabbitMQ's application is stopped and started. Exactly once: the references abandoned
    in the outage are reconciled before their events go again."""
    target = make_target(confirm_timeout="1s", producer_lease="2s")
    pending: dict[str, list[OutboxEvent]] = {f"k{k}": [] for k in range(5)}
    stopper = threading.Thread(target=stop_broker)
    outages = seen = 0
    restarted = False
    try:
        deadline = time.monotonic() + 180
        while not restarted or any(pending.values()):
            assert time.monotonic() < deadline, "the target did not recover"
            if not restarted:  # traffic goes on until the broker is back
                for event in emit(log, 5, keys=5)[seen:]:
                    pending[event.partition_key or ""].append(event)
                seen += 5
                if seen == 50:
                    stopper.start()
            batch = [e for run in pending.values() for e in run[:4]]
            try:
                results = target.publish(batch)
            except (TargetUnavailable, TargetCallFailed) as exc:
                outages += 1
                confirmed = getattr(exc, "confirmed", None) or [False] * len(batch)
                results = [None if ok else "failed" for ok in confirmed]
                if not restarted:
                    stopper.join()
                    start_broker()
                    wait_for_streams()
                    restarted = True
            for event, result in zip(batch, results, strict=True):
                if result is None:
                    pending[event.partition_key or ""].remove(event)
    finally:
        if stopper.ident is not None:
            stopper.join()
        start_broker()
        wait_for_streams()
    assert outages >= 1
    assert_once_in_order(stream, logged(log))


# -- configuration --------------------------------------------------------------------------


def stream_config(**entry: Any) -> Any:
    return load_config(
        {"targets": {"rs": {"kind": "rabbitmq_stream", "stream": "orders", **entry}}}
    ).targets["rs"]


def test_a_configuration_builds_the_target_through_the_registry() -> None:
    target = build_target("rs", stream_config(stream="orders-{event_type}", producers=2))
    assert isinstance(target, RabbitMQStreamTarget)
    target.close()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"servers": ["amqp://127.0.0.1:5672/"]}, "is not a RabbitMQ stream URL"),
        ({"servers": ["rabbitmq-stream://h:5552/?tls=1"]}, "not in the URL"),
        ({"stream": "orders-{nope}"}, "nope"),
        ({"producer_lease": "2s", "confirm_timeout": "5s"}, "longer than confirm_timeout"),
        ({"tls": {"verify": False}}, "rabbitmq-stream+tls://"),
        ({"producers": 0}, "producers"),
        ({"frame_max": 100}, "frame_max"),
    ],
)
def test_a_bad_configuration_is_a_config_error_naming_it(
    entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("+", r"\+").replace("?", r"\?")):
        stream_config(**entry)


def test_the_password_is_never_shown_in_a_configuration_error() -> None:
    with pytest.raises(ConfigError) as error:
        stream_config(password="s3cret-pw", servers=["nope://x"])
    assert "s3cret-pw" not in str(error.value)


# -- a real relay, SIGKILLed -----------------------------------------------------------------


def _published(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            select(func.count()).where(outbox_event.c.status == "PUBLISHED")
        ).scalar_one()


@pytest.mark.slow
@pytest.mark.spark
def test_a_sigkilled_relay_restarted_stores_every_event_exactly_once_in_key_order(
    tmp_path: Path, stream: str
) -> None:
    """A ``tidings relay`` process tree (Spark and all) SIGKILLed while publishing to a
    stream, then a new one runs to the end: every event is in the stream once, each key's
    in log order, every row PUBLISHED but a poison event (logged by a producer that does not
    check its targets, too large for a frame), which is FAILED alone with the reason. The
    killed relay's reference is reconciled by the next one (its lease is short here: 3 s).
    Without Spark, the dead sender test above makes each case of the reconciliation happen
    for sure."""
    total, keys = 1200, 20
    target = {
        "kind": "rabbitmq_stream",
        "stream": stream,
        "create_stream": True,
        "producer_lease": "3s",
        "confirm_timeout": "2s",
        "frame_max": 8192,
    }
    config = relay_config(
        tmp_path,
        targets={"rs": target},
        routes={"Created": ["rs"]},
        max_events_per_batch=150,
        replay_every=None,
    )
    path = write_config(config, tmp_path / "tidings.yaml")
    engine = make_engine(config.database.url)
    rng = random.Random(7)
    outbox = Outbox(engine)
    for start in range(0, total, 100):
        with outbox.transaction() as tx:
            for n in range(start, start + 100):
                tx.emit("Created", {"n": n}, partition_key=f"k{rng.randrange(keys)}")
            if start == 500:
                poison = tx.emit("Created", {"blob": "x" * 9000}, partition_key="poison")
    out = tmp_path / "relay.log"

    def relay() -> subprocess.Popen[bytes]:
        return tidings_cli(
            "relay",
            "--config",
            str(path),
            stdout=out.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def until(count: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
        def reached() -> bool:
            assert proc.poll() is None, out.read_text()[-3000:]
            return _published(engine) >= count

        wait_until(reached, timeout, interval=0.05, explain=lambda: out.read_text()[-3000:])

    proc = relay()
    until(int(total * rng.uniform(0.2, 0.5)), proc, 300)  # mid-run, wherever it is
    kill_tree(proc)
    proc = relay()
    try:
        until(total, proc, 300)
        wait_until(lambda: _status(engine, poison) == "FAILED", 60, interval=0.1)
    finally:
        kill_tree(proc)

    with engine.connect() as conn:
        error = conn.execute(
            select(outbox_event.c.error_details).where(outbox_event.c.event_id == poison)
        ).scalar_one()
    assert "over the connection's frame_max of 8192" in error
    assert_once_in_order(stream, [e for e in logged(engine) if e.event_id != poison])
    engine.dispose()


def _status(engine: Engine, event_id: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                select(outbox_event.c.status).where(outbox_event.c.event_id == event_id)
            ).scalar_one()
        )
