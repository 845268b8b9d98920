"""The JetStream target against real NATS servers: what only this kind does (subjects and
NATS headers, de-duplication by event id, the stream it creates or checks, a server dying or
stalling mid-call, credentials files, nkeys, TLS). The contract every kind keeps is checked
in ``tests/targets/contract/``.

Most tests use the shared server on 127.0.0.1:4222, each with its own stream and subject
prefix so they never see each other's messages. Outage and recovery tests run a private
``nats-server`` on a free port instead, so the shared server is never stopped.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import nkeys
import pytest
from nats.js.api import DiscardPolicy, RawStreamMsg, StorageType
from nats.js.errors import NotFoundError
from sqlalchemy import select

import tidings.targets.registry  # noqa: F401 - enters the target kinds into the config
from bench.harness.processes import NATS_SERVER, NatsServer, free_port, wait_for_port
from tests.support.helpers import (
    SHARED_URL,
    admin,
    delete_stream,
    relay_config,
    statuses,
    stream_info,
    stream_messages,
)
from tests.targets.makers import target_config, target_maker
from tests.targets.outbox_events import event, full_event
from tidings.db import make_engine
from tidings.errors import ConfigError, TargetCallFailed, TargetUnavailable
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.pipeline.publishing.breaker import MAX_PAUSE_S
from tidings.pipeline.relay_query import start_relay
from tidings.pipeline.replay import ReplayLimits, run_replay
from tidings.targets.kinds.jetstream.config import JetStreamTargetConfig
from tidings.targets.kinds.jetstream.messages import (
    message_headers,
    subject_token,
)
from tidings.targets.kinds.jetstream.stream import subject_covers
from tidings.targets.kinds.jetstream.target import JetStreamTarget

pytestmark = pytest.mark.nats


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
    defaults = {"kind": "jetstream", "stream": stream, "subject_prefix": prefix,
                "servers": [SHARED_URL], "ack_timeout": "2s"}  # fmt: skip
    yield from target_maker(
        lambda entry: JetStreamTarget("js-test", JetStreamTargetConfig(**entry)), defaults
    )
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
    full = full_event(
        1, {"X-Tenant": "acme", "Tidings-Seq": "forged"}, event_type="order.created v2"
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


def test_a_call_sends_each_key_in_order_and_nothing_of_a_key_after_its_failure(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    """Several events of a key in one call (the relay gives up to ``events_per_key``): each
    leaves once the one before it is acknowledged, so a refused one (here the stream is
    full: discard new, 2 messages) stops its key, and the events after it are not sent."""
    stream, prefix = names
    admin(
        lambda js: js.add_stream(
            name=stream, subjects=[f"{prefix}.>"], max_msgs=2, discard=DiscardPolicy.NEW
        )
    )
    target = make_target(create_stream=False)
    k1 = [event(seq, partition_key="k1") for seq in (1, 2, 3)]
    k2 = [event(4, partition_key="k2")]

    results = target.publish([k1[0], k2[0], k1[1], k1[2]])

    assert results[0] is None and results[1] is None  # each key's first event: stored
    assert results[2] is not None and "maximum messages exceeded" in results[2]
    assert results[3] is not None and "not sent: event seq 2 of its key failed" in results[3]
    stored = [int(msg.headers["Tidings-Seq"]) for msg in stream_messages(stream) if msg.headers]
    assert sorted(stored) == [1, 4]


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


def test_create_stream_true_updates_what_is_missing_and_says_what_it_changed(
    make_target: Callable[..., JetStreamTarget],
    names: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream, prefix = names
    other = f"{prefix}_other.>"
    admin(
        lambda js: js.add_stream(name=stream, subjects=[other], duplicate_window=120, max_msgs=50)
    )

    target = make_target(create_stream=True, duplicate_window="300s")
    assert target.publish([event(1)]) == [None]

    config = stream_info(stream).config
    assert config.subjects == [other, f"{prefix}.>"]  # others' subjects are kept
    assert config.duplicate_window == 300
    assert config.max_msgs == 50  # nothing else is touched
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"updated existing stream {stream!r}" in warning
    assert f"added subject '{prefix}.>'" in warning
    assert "raised duplicate_window from 120s to 300s" in warning


def test_without_create_stream_a_missing_stream_is_an_error(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    target = make_target(create_stream=False)

    result = target.publish([event(1), event(2)])

    assert all(r is not None and "no stream takes this subject" in r for r in result)
    assert all("js-test" in r and f"{names[1]}.order_created" in r for r in result if r)


# -- outages ----------------------------------------------------------------------------------


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


def test_a_server_that_dies_during_a_call_is_down_and_no_message_is_blamed(
    make_target: Callable[..., JetStreamTarget],
    private_server: NatsServer,
    names: tuple[str, str],
) -> None:
    """Killed while a large call is under way: the target is unavailable (the relay charges
    no retry), not a call that failed for one message; sent again once the server is back,
    every message is in the stream once."""
    target = make_target(servers=[private_server.url])
    private_server.start()
    assert target.publish([event(1)]) == [None]  # connected before the call
    batch = [event(n) for n in range(2, 40_002)]
    killer = threading.Timer(0.05, private_server.kill)
    killer.start()

    with pytest.raises(TargetUnavailable) as raised:
        target.publish(batch)

    killer.join()
    assert "went away during the call" in str(raised.value) or "cannot connect" in str(raised.value)
    private_server.start()  # same store
    assert target.publish(batch) == [None] * len(batch)
    assert stream_info(names[0], private_server.url).state.messages == 1 + len(batch)


def test_a_server_that_stops_acknowledging_mid_call_fails_the_call_with_what_it_confirmed(
    make_target: Callable[..., JetStreamTarget],
    private_server: NatsServer,
    names: tuple[str, str],
) -> None:
    """The server freezes (SIGSTOP) while a key's run goes one ack after another: the events
    acknowledged so far are confirmed and the call fails as a whole (the relay narrows it;
    the server's silence is no event's fault); resumed, the run sent again is stored once
    and in order."""
    target = make_target(servers=[private_server.url], ack_timeout="500ms")
    private_server.start()
    assert target.publish([event(1)]) == [None]  # connected, stream made
    run = [event(seq, partition_key="k") for seq in range(2, 2 + target.events_per_key)]

    def freeze_midway() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if stream_info(names[0], private_server.url).state.messages > 50:
                private_server.suspend()
                return
            time.sleep(0.002)

    freezer = threading.Thread(target=freeze_midway)
    freezer.start()
    try:
        with pytest.raises(TargetCallFailed) as raised:
            target.publish(run)
    finally:
        freezer.join()
        private_server.resume()

    assert "stopped acknowledging" in str(raised.value)
    confirmed = raised.value.confirmed
    acked = confirmed.count(True)
    assert 50 <= acked < len(run)
    assert confirmed == [True] * acked + [False] * (len(run) - acked)  # a prefix, in order
    assert target.publish(run) == [None] * len(run)
    stored = [int(m.headers["Tidings-Seq"]) for m in stream_messages(names[0], private_server.url)]
    assert stored == [1, *(e.seq for e in run)]


def test_a_server_that_acknowledges_nothing_is_down(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    """No stream takes the subjects, but a plain subscriber listens and never replies, so
    no ack (and no "no responders") comes: no message is to blame, the target is down."""
    host, port = SHARED_URL.removeprefix("nats://").split(":")
    with socket.create_connection((host, int(port))) as mute:
        mute.recv(4096)  # the server's INFO
        mute.sendall(f"CONNECT {{}}\r\nSUB {names[1]}.> 1\r\nPING\r\n".encode())
        assert b"PONG" in mute.recv(4096)
        target = make_target(create_stream=False, ack_timeout="300ms")

        with pytest.raises(TargetUnavailable) as raised:
            target.publish([event(1), event(2)])

    assert "acknowledged none of 2 messages within 0.3s" in str(raised.value)


# -- a stream ops manage (create_stream, on_mismatch) ----------------------------------------


def ops_stream(stream: str, subjects: list[str], window: float) -> dict[str, Any]:
    """A stream made by "ops" with nats-py directly (its own max_msgs too); its settings."""
    admin(
        lambda js: js.add_stream(
            name=stream, subjects=subjects, duplicate_window=window, max_msgs=1000
        )
    )
    return stream_info(stream).config.as_dict()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.parametrize("create_stream", ["if-missing", False])
def test_an_ops_stream_that_fits_is_used_and_left_unchanged(
    make_target: Callable[..., JetStreamTarget],
    names: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
    create_stream: object,
) -> None:
    stream, prefix = names
    before = ops_stream(stream, [f"{prefix}_audit", f"{prefix}.>"], window=1200)

    target = make_target(create_stream=create_stream, on_mismatch="fail")
    assert target.publish([event(1), event(2)]) == [None, None]

    assert stream_info(stream).config.as_dict() == before
    assert stream_info(stream).state.messages == 2
    assert warnings_of(caplog) == []


def test_the_default_never_rewrites_a_stream_that_does_not_fit(
    make_target: Callable[..., JetStreamTarget],
    names: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Default create_stream ("if-missing") and on_mismatch ("warn"): the stream stays as
    ops made it, the warning names each missing setting, and the publish results say why
    the events were not stored."""
    stream, prefix = names
    before = ops_stream(stream, [f"{prefix}_other.>"], window=30)

    results = make_target().publish([event(1)])

    assert results[0] is not None and "no stream takes this subject" in results[0]
    assert stream_info(stream).config.as_dict() == before
    (warning,) = warnings_of(caplog)
    assert f"stream {stream!r} does not fit" in warning
    assert f"do not capture '{prefix}.*' (add '{prefix}.>')" in warning
    assert "duplicate_window is 30s, shorter than the target's duplicate_window of 600s" in (
        warning
    )


def test_on_mismatch_fail_makes_the_target_unavailable_until_ops_fix_the_stream(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    stream, prefix = names
    before = ops_stream(stream, [f"{prefix}.>"], window=60)
    target = make_target(on_mismatch="fail", duplicate_window="2m")

    with pytest.raises(TargetUnavailable) as raised:
        target.publish([event(1)])

    message = str(raised.value)
    assert message.startswith(f"jetstream target 'js-test': stream {stream!r} does not fit")
    assert "duplicate_window is 60s, shorter than the target's duplicate_window of 120s" in message
    assert stream_info(stream).config.as_dict() == before
    assert stream_info(stream).state.messages == 0

    fixed = stream_info(stream).config.evolve(duplicate_window=120)
    admin(lambda js: js.update_stream(fixed))
    assert target.publish([event(1)]) == [None]  # the next connection checks again


def test_create_stream_false_with_no_stream_fails_naming_it(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    target = make_target(create_stream=False, on_mismatch="fail")

    with pytest.raises(TargetUnavailable, match="it does not exist \\(create_stream is false\\)"):
        target.publish([event(1)])

    with pytest.raises(NotFoundError):
        stream_info(names[0])


def test_if_missing_creates_the_stream_with_storage_replicas_and_max_age(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    stream, prefix = names

    target = make_target(storage="memory", replicas=1, max_age="2h", duplicate_window="90s")
    assert target.publish([event(1)]) == [None]

    config = stream_info(stream).config
    assert config.subjects == [f"{prefix}.>"]
    assert config.storage == StorageType.MEMORY
    assert config.num_replicas == 1
    assert config.max_age == 7200
    assert config.duplicate_window == 90


def test_a_stream_subject_with_wildcards_that_captures_ours_fits() -> None:
    assert subject_covers("orders.>", "orders.*")
    assert subject_covers("orders.*", "orders.*")
    assert subject_covers("*.*", "orders.*")
    assert subject_covers(">", "orders.*.*")
    assert not subject_covers("orders.*", "orders.*.*")
    assert not subject_covers("orders.created", "orders.*")
    assert not subject_covers("orders.*.>", "orders.*")
    assert not subject_covers("orders", "orders.*")


@pytest.mark.spark
def test_the_relay_holds_events_while_the_stream_does_not_fit_then_delivers_them(
    spark: Any, names: tuple[str, str], tmp_path: Path
) -> None:
    """on_mismatch: fail is the target being down for the relay: no event is charged a
    retry or FAILED; they wait (HELD) with the reason, and go once ops fixed the stream."""
    stream, prefix = names
    ops_stream(stream, [f"{prefix}_other.>"], window=600)
    target = {
        "kind": "jetstream",
        "stream": stream,
        "subject_prefix": prefix,
        "on_mismatch": "fail",
        "ack_timeout": "2s",
    }
    config = relay_config(tmp_path, targets={"js": target}, routes={"Created": ["js"]})
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    for n in range(3):
        with outbox.transaction() as tx:
            tx.emit("Created", {"n": n}, partition_key="k")
    try:
        start_relay(spark, config, available_now=True).awaitTermination()
        with engine.connect() as conn:
            rows = conn.execute(select(outbox_event).order_by(outbox_event.c.seq)).all()
        assert [r.status for r in rows] == ["HELD"] * 3
        assert all(r.retry_count == 0 for r in rows)
        assert f"stream {stream!r} does not fit" in rows[0].error_details

        fixed = stream_info(stream).config.evolve(subjects=[f"{prefix}.>"])
        admin(lambda js: js.update_stream(fixed))
        time.sleep(MAX_PAUSE_S + 0.5)  # the breaker's longest pause: a probe is due now
        now = ReplayLimits.from_config(config)
        run_replay(spark, config, limits=replace(now, older_than=timedelta(0)))
        assert set(statuses(engine).values()) == {"PUBLISHED"}
        assert stream_info(stream).state.messages == 3
    finally:
        delete_stream(stream)


# -- subject templates -----------------------------------------------------------------------


def test_the_stream_it_creates_captures_what_the_template_can_produce(
    make_target: Callable[..., JetStreamTarget], names: tuple[str, str]
) -> None:
    stream, prefix = names
    template = f"{prefix}.{{headers.aggregate_type}}.{{payload.region}}"
    target = make_target(subject_prefix=None, subject_template=template)
    order = event(1, headers={"aggregate_type": "order"}, payload='{"region": "eu"}')

    assert target.publish([order]) == [None]

    assert [m.subject for m in stream_messages(stream)] == [f"{prefix}.order.eu"]
    assert stream_info(stream).config.subjects == [f"{prefix}.*.*"]


def test_an_ops_stream_is_checked_against_the_template_subjects(
    make_target: Callable[..., JetStreamTarget],
    names: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream, prefix = names
    ops_stream(stream, [f"{prefix}.*"], window=600)  # one token after the prefix, not two
    target = make_target(
        subject_prefix=None,
        subject_template=f"{prefix}.{{partition_key}}.{{event_type}}",
        on_mismatch="fail",
    )

    with pytest.raises(TargetUnavailable, match=f"do not capture '{prefix}.\\*.\\*'"):
        target.publish([event(1, partition_key="k", event_type="Created")])


def jetstream_config(tmp_path: Path | None = None, **entry: Any) -> Any:
    """A configuration with one jetstream target ``js``; from a file in ``tmp_path`` if
    given (so relative paths are relative to it)."""
    return target_config("js", {"kind": "jetstream", "stream": "S", "subject_prefix": "p",
                                **entry}, tmp_path)  # fmt: skip


@pytest.mark.parametrize(
    ("entry", "key", "missing"),
    [
        ({"credentials": "user.creds"}, "credentials", "user.creds"),
        ({"nkey": "user.nk"}, "nkey", "user.nk"),
        ({"tls": {"ca_file": "ca.pem"}}, "tls.ca_file", "ca.pem"),
        ({"tls": {"ca_file": __file__, "cert_file": "c.pem"}}, "tls.cert_file", "c.pem"),
    ],
)
def test_a_missing_credentials_nkey_or_tls_file_is_a_config_error_naming_it(
    tmp_path: Path, entry: dict[str, Any], key: str, missing: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        jetstream_config(tmp_path, **entry)

    assert f"{key} file '{tmp_path / missing}' does not exist" in str(raised.value)


def test_credential_paths_are_relative_to_the_configuration_file(tmp_path: Path) -> None:
    (tmp_path / "user.creds").write_text("creds")
    (tmp_path / "ca.pem").write_text("ca")

    config = jetstream_config(tmp_path, credentials="user.creds", tls={"ca_file": "ca.pem"})

    assert config.credentials == str(tmp_path / "user.creds")
    assert config.tls.ca_file == str(tmp_path / "ca.pem")
    with pytest.raises(ConfigError, match="credentials or nkey, not both"):
        jetstream_config(tmp_path, credentials="user.creds", nkey="user.creds")


# -- credentials, nkey and TLS, against a private nats-server that requires them -------------


@contextlib.contextmanager
def secured_server(tmp_path: Path, settings: str) -> Iterator[str]:
    """A private ``nats-server -js`` started with a generated configuration (``settings``
    adds its authorization or TLS blocks); its URL. Killed afterwards."""
    port = free_port()
    config = tmp_path / "nats.conf"
    config.write_text(
        f'listen: "127.0.0.1:{port}"\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n{settings}'
    )
    process = subprocess.Popen(
        [NATS_SERVER, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port, 10.0, process=process)
        yield f"nats://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait()


def test_an_nkey_seed_file_authenticates(
    make_target: Callable[..., JetStreamTarget], tmp_path: Path
) -> None:
    user = nkeys.from_seed(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    seed = tmp_path / "user.nk"
    seed.write_bytes(user.seed)
    users = f'authorization {{ users = [ {{ nkey: "{user.public_key.decode()}" }} ] }}\n'

    with secured_server(tmp_path, users) as url:
        assert make_target(servers=[url], nkey=str(seed)).publish([event(1)]) == [None]
        with pytest.raises(TargetUnavailable, match="Authorization Violation"):
            make_target(servers=[url]).publish([event(2)])


def _keypair(prefix: int) -> nkeys.KeyPair:
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def _jwt(issuer: nkeys.KeyPair, subject: nkeys.KeyPair, nats_claims: dict[str, Any]) -> str:
    """A NATS JWT (v2) for ``subject`` signed by ``issuer``, as ``nsc`` would make it."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    claims = {
        "jti": base64.b32encode(os.urandom(20)).decode().rstrip("="),
        "iat": int(time.time()),
        "iss": issuer.public_key.decode(),
        "sub": subject.public_key.decode(),
        "name": "tidings-test",
        "nats": {**nats_claims, "version": 2},
    }
    signed = f"{b64(json.dumps({'typ': 'JWT', 'alg': 'ed25519-nkey'}).encode())}."
    signed += b64(json.dumps(claims).encode())
    return f"{signed}.{b64(issuer.sign(signed.encode()))}"


def test_a_user_credentials_file_authenticates(
    make_target: Callable[..., JetStreamTarget], tmp_path: Path
) -> None:
    """Operator mode, as nsc sets it up: operator, system account and an account with
    JetStream, all preloaded; the user's JWT and seed in one credentials file."""
    operator = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
    system, account = _keypair(nkeys.PREFIX_BYTE_ACCOUNT), _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    user = _keypair(nkeys.PREFIX_BYTE_USER)
    limits = {"subs": -1, "data": -1, "payload": -1, "conn": -1, "wildcards": True}
    jetstream = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    (tmp_path / "operator.jwt").write_text(_jwt(operator, operator, {"type": "operator"}))
    accounts = {
        system: _jwt(operator, system, {"type": "account", "limits": limits}),
        account: _jwt(operator, account, {"type": "account", "limits": limits | jetstream}),
    }
    preload = ", ".join(f'{k.public_key.decode()}: "{v}"' for k, v in accounts.items())
    settings = (
        f'operator: "{tmp_path / "operator.jwt"}"\nresolver: MEMORY\n'
        f"system_account: {system.public_key.decode()}\nresolver_preload: {{ {preload} }}\n"
    )
    user_jwt = _jwt(account, user, {"type": "user", "pub": {}, "sub": {}, **limits})
    creds = tmp_path / "user.creds"
    creds.write_text(
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user.seed.decode()}\n------END USER NKEY SEED------\n"
    )

    with secured_server(tmp_path, settings) as url:
        assert make_target(servers=[url], credentials=str(creds)).publish([event(1)]) == [None]
        with pytest.raises(TargetUnavailable, match="Authorization Violation"):
            make_target(servers=[url]).publish([event(2)])


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _certificates(directory: Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    files = {n: str(directory / n) for n in ("ca.pem", "ca.key", "server.pem", "server.key")}
    files |= {n: str(directory / n) for n in ("client.pem", "client.key")}
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
             "-keyout", files["ca.key"], "-out", files["ca.pem"])  # fmt: skip
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1"), ("client", None)):
        csr = str(directory / f"{name}.csr")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", files[f"{name}.key"], "-out", csr)  # fmt: skip
        extra = ["-extfile", str(directory / f"{name}.ext")] if extension else []
        if extension:
            (directory / f"{name}.ext").write_text(extension + "\n")
        _openssl("x509", "-req", "-in", csr, "-CA", files["ca.pem"], "-CAkey", files["ca.key"],
                 "-CAcreateserial", "-days", "1", "-out", files[f"{name}.pem"], *extra)  # fmt: skip
    return files


def test_tls_with_a_client_certificate(
    make_target: Callable[..., JetStreamTarget], tmp_path: Path
) -> None:
    files = _certificates(tmp_path)
    tls = (
        f'tls {{ cert_file: "{files["server.pem"]}", key_file: "{files["server.key"]}", '
        f'ca_file: "{files["ca.pem"]}", verify: true }}\n'
    )
    client = {
        "ca_file": files["ca.pem"],
        "cert_file": files["client.pem"],
        "key_file": files["client.key"],
    }

    with secured_server(tmp_path, tls) as url:
        assert make_target(servers=[url], tls=client).publish([event(1)]) == [None]
        without_cert = {"ca_file": files["ca.pem"]}
        with pytest.raises(TargetUnavailable, match="jetstream target 'js-test'"):
            make_target(servers=[url], tls=without_cert).publish([event(2)])
        with pytest.raises(TargetUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            make_target(servers=[url]).publish([event(3)])  # the system CAs do not know ours
