"""The JetStream target against real NATS servers.

Most tests use the shared server on 127.0.0.1:4222, each with its own stream and subject
prefix so they never see each other's messages. Outage and recovery tests run a private
``nats-server`` on a free port instead, so the shared server is never stopped.
"""

from __future__ import annotations

import base64
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import RawStreamMsg

from helpers import (
    SHARED_URL,
    admin,
    delete_stream,
    stream_info,
    stream_messages,
)
from processes import NatsServer, free_port
from tidings.errors import TargetCallFailed, TargetError, TargetUnavailable
from tidings.events.outbox import OutboxEvent
from tidings.targets.jetstream import JetStreamTarget, JetStreamTargetConfig
from tidings.targets.jetstream_messages import header_block_size, message_headers, subject_token

pytestmark = pytest.mark.nats

LOGGED_AT = datetime(2024, 5, 17, 9, 30, 15, 123456, tzinfo=UTC)


def event(seq: int, **fields: Any) -> OutboxEvent:
    """An event with a fresh id; ``fields`` override any attribute."""
    values: dict[str, Any] = {
        "seq": seq,
        "event_id": uuid.uuid4().hex,
        "event_type": "order.created",
        "payload": f'{{"n": {seq}}}',
        "logged_at": LOGGED_AT,
    }
    values.update(fields)
    return OutboxEvent(**values)


def raw_headers(msg: RawStreamMsg) -> list[tuple[str, str]]:
    """Header lines exactly as stored, duplicates included (the parsed dict hides them)."""
    assert msg.hdrs is not None
    lines = base64.b64decode(msg.hdrs).decode().split("\r\n")[1:]
    return [(k, v.strip()) for k, v in (line.split(":", 1) for line in lines if line)]


@pytest.fixture
def private_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(free_port(), tmp_path / "jetstream")
    yield server
    server.kill()


@pytest.fixture
def names() -> tuple[str, str]:
    """A stream name and subject prefix no other test uses."""
    tag = uuid.uuid4().hex[:12]
    return f"TIDINGS_TEST_{tag}", f"tidings_test.{tag}"


@pytest.fixture
def make_target(names: tuple[str, str]) -> Iterator[Callable[..., JetStreamTarget]]:
    """Build targets on the test's stream; close them and delete the stream afterwards."""
    stream, prefix = names
    built: list[JetStreamTarget] = []

    def make(**overrides: Any) -> JetStreamTarget:
        settings: dict[str, Any] = {
            "kind": "jetstream",
            "stream": stream,
            "subject_prefix": prefix,
            "servers": [SHARED_URL],
            "ack_timeout": "2s",
        }
        settings.update(overrides)
        target = JetStreamTarget("js-test", JetStreamTargetConfig(**settings))
        built.append(target)
        return target

    yield make
    for target in built:
        target.close()
    # Streams on private servers vanish with their store; only the shared one needs cleaning.
    delete_stream(stream)


# -- subjects and headers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event_type", "token"),
    [
        ("order.created", "order_created"),
        ("order created", "order_created"),
        ("a*b>c\td", "a_b_c_d"),
        ("OrderCreated-v2", "OrderCreated-v2"),
        ("", "_"),
    ],
)
def test_subject_token_replaces_characters_nats_forbids(event_type: str, token: str) -> None:
    assert subject_token(event_type) == token


def test_reserved_headers_win_over_custom_ones() -> None:
    e = event(
        7,
        headers={
            "X-Tenant": "acme",
            "tidings-seq": "999",
            "Nats-Msg-Id": "forged",
            "NATS-TTL": "1",
        },
    )

    headers = message_headers(e)

    assert headers["X-Tenant"] == "acme"
    assert headers["Nats-Msg-Id"] == e.event_id
    assert headers["Tidings-Seq"] == "7"
    assert "tidings-seq" not in headers and "NATS-TTL" not in headers


def test_messages_arrive_with_subject_headers_and_body(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    stream, prefix = names
    full = event(
        1,
        event_type="order.created v2",
        payload='{"id": 1, "name": "Grüße"}',
        version="2",
        correlation_id="corr-1",
        originator="shop",
        partition_key="order-1",
        headers={"X-Tenant": "acme", "Tidings-Seq": "forged"},
    )
    bare = event(2, event_type="OrderShipped")

    assert make_target().publish([full, bare]) == [None, None]

    first, second = stream_messages(stream)
    assert first.subject == f"{prefix}.order_created_v2"
    assert first.data == '{"id": 1, "name": "Grüße"}'.encode()
    assert raw_headers(first) == [
        ("X-Tenant", "acme"),
        ("Nats-Msg-Id", full.event_id),
        ("Tidings-Event-Type", "order.created v2"),
        ("Tidings-Event-Version", "2"),
        ("Tidings-Seq", "1"),
        ("Tidings-Logged-At", "2024-05-17T09:30:15.123456+00:00"),
        ("Tidings-Correlation-Id", "corr-1"),
        ("Tidings-Originator", "shop"),
        ("Tidings-Partition-Key", "order-1"),
    ]
    assert second.subject == f"{prefix}.OrderShipped"
    assert {k for k, _ in raw_headers(second)} == {
        "Nats-Msg-Id",
        "Tidings-Event-Type",
        "Tidings-Event-Version",
        "Tidings-Seq",
        "Tidings-Logged-At",
    }


def test_events_of_a_key_are_stored_in_call_order(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    target = make_target()
    keys = [f"key-{k}" for k in range(10)]
    seq = 0
    for _ in range(5):  # one event per key per call, as the relay guarantees
        batch = []
        for key in keys:
            seq += 1
            batch.append(event(seq, partition_key=key))
        assert target.publish(batch) == [None] * len(batch)

    stored: dict[str, list[int]] = {key: [] for key in keys}
    for msg in stream_messages(names[0]):
        assert msg.headers is not None
        stored[msg.headers["Tidings-Partition-Key"]].append(int(msg.headers["Tidings-Seq"]))
    for key in keys:
        assert stored[key] == sorted(stored[key]) and len(stored[key]) == 5


def test_a_bad_custom_header_fails_only_its_own_event(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    good, bad = event(1), event(2, headers={"Bad Header": "x"})

    result = make_target().publish([good, bad])

    assert result[0] is None
    assert result[1] is not None and "BadHeaderError" in result[1]
    assert stream_info(names[0]).state.messages == 1


def message_size(event: OutboxEvent) -> tuple[int, int]:
    """``(payload bytes, header bytes)`` of the message ``event`` becomes."""
    return len(event.payload.encode()), header_block_size(message_headers(event))


def _just_over_the_limit(limit: int) -> OutboxEvent:
    """An event whose payload fits ``limit`` alone, but not with its headers."""
    probe = event(2)
    _, headers = message_size(probe)
    return event(2, event_id=probe.event_id, payload='"' + "x" * (limit - headers // 2) + '"')


def test_a_message_over_max_payload_with_its_headers_fails_alone_with_the_sizes(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    target = make_target()
    assert target.publish([event(1)]) == [None]
    limit = 1024 * 1024  # the shared server runs with NATS's default max_payload
    big = _just_over_the_limit(limit)
    payload, headers = message_size(big)
    assert payload <= limit < payload + headers

    results = target.publish([event(3), big, event(4)])

    assert results[0] is None and results[2] is None  # its neighbours are not harmed
    assert results[1] is not None
    assert f"payload {payload} + headers {headers}" in results[1]
    assert f"max_payload of {limit} bytes" in results[1]
    assert target.publish([event(5)]) == [None]  # the connection was never broken
    assert stream_info(names[0]).state.messages == 4


def test_refusal_learns_the_server_limit_before_any_publish(
    make_target: Callable[..., JetStreamTarget],
) -> None:
    target = make_target()
    big = _just_over_the_limit(1024 * 1024)

    reason = target.refusal(big)

    assert reason is not None and "over the NATS server's max_payload" in reason
    assert target.refusal(event(1)) is None


def test_publishing_from_many_threads_at_once(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    target = make_target()
    results: list[list[str | None]] = []

    def publish(base: int) -> None:
        results.append(target.publish([event(base + i) for i in range(250)]))

    threads = [threading.Thread(target=publish, args=(n * 1000,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert [r for batch in results for r in batch] == [None] * 1000
    assert stream_info(names[0]).state.messages == 1000


# -- deduplication and the stream ------------------------------------------------------------


def test_replaying_the_same_event_ids_stores_nothing_twice(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    target = make_target()
    batch = [event(seq) for seq in range(1, 21)]
    assert target.publish(batch) == [None] * 20

    # A crash replay: the same events again, from a fresh target as after a restart.
    assert target.publish(batch) == [None] * 20
    assert make_target().publish(batch[5:]) == [None] * 15

    assert stream_info(names[0]).state.messages == 20


def test_creates_the_stream_with_its_subjects_and_dedup_window(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    stream, prefix = names

    assert make_target(duplicate_window="90s").publish([event(1)]) == [None]

    config = stream_info(stream).config
    assert config.subjects == [f"{prefix}.>"]
    assert config.duplicate_window == 90


def test_updates_an_existing_stream_and_keeps_its_other_subjects(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    stream, prefix = names
    other = f"{prefix}_other.>"
    admin(lambda js: js.add_stream(name=stream, subjects=[other], duplicate_window=120))

    assert make_target(duplicate_window="30s").publish([event(1)]) == [None]

    config = stream_info(stream).config
    assert config.subjects == [other, f"{prefix}.>"]
    assert config.duplicate_window == 30


def test_without_create_stream_a_missing_stream_is_an_error(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    target = make_target(create_stream=False)

    result = target.publish([event(1), event(2)])

    assert all(r is not None and "no stream takes this subject" in r for r in result)
    assert all("js-test" in r and f"{names[1]}.order_created" in r for r in result if r)


# -- outages ----------------------------------------------------------------------------------


def test_unreachable_server_is_reported_as_unavailable_quickly(
    make_target: Callable[..., JetStreamTarget],
) -> None:
    target = make_target(servers=[f"nats://127.0.0.1:{free_port()}"])
    started = time.monotonic()

    with pytest.raises(TargetUnavailable) as raised:
        target.publish([event(1), event(2, event_type="order.paid")])

    assert time.monotonic() - started < 60  # returns instead of retrying for minutes
    assert "'js-test'" in str(raised.value) and "cannot connect" in str(raised.value)


def test_recovers_once_the_server_becomes_reachable(
    make_target: Callable[..., JetStreamTarget],
    private_server: NatsServer,
    names: tuple[str, str],
) -> None:
    target = make_target(servers=[private_server.url])
    first = event(1)
    with pytest.raises(TargetUnavailable):
        target.publish([first])

    private_server.start()

    assert target.publish([first, event(2)]) == [None, None]
    assert stream_info(names[0], private_server.url).state.messages == 2


def test_survives_a_server_outage_and_comes_back(
    make_target: Callable[..., JetStreamTarget],
    private_server: NatsServer,
    names: tuple[str, str],
) -> None:
    target = make_target(servers=[private_server.url])
    private_server.start()
    before = event(1)
    assert target.publish([before]) == [None]

    private_server.kill()
    with pytest.raises((TargetUnavailable, TargetCallFailed)):
        target.publish([event(2), event(3)])

    private_server.start()  # same store: the stream and its dedup state survive
    assert target.publish([before, event(4)]) == [None, None]
    assert stream_info(names[0], private_server.url).state.messages == 2


# -- lifecycle --------------------------------------------------------------------------------


def test_empty_publish_needs_no_server(make_target: Callable[..., JetStreamTarget]) -> None:
    assert make_target(servers=[f"nats://127.0.0.1:{free_port()}"]).publish([]) == []


def test_close_stops_the_loop_thread_and_is_idempotent(
    make_target: Callable[..., JetStreamTarget],
) -> None:
    target = make_target()
    assert target.publish([event(1)]) == [None]
    before = {t.name for t in threading.enumerate()}
    assert "tidings-jetstream-js-test" in before

    target.close()
    target.close()

    assert "tidings-jetstream-js-test" not in {t.name for t in threading.enumerate()}
    with pytest.raises(TargetError):
        target.publish([event(2)])
