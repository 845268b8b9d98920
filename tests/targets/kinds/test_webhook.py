"""The webhook target against a real local HTTP server (Starlette on uvicorn, its own
process: :mod:`tests.targets.kinds.webhook_server`), which answers each event as the event
asks it to: confirmed, refused, retried with ``Retry-After``, too slow, not at all.

Here is what only this kind does (CloudEvents modes, retries and Retry-After, timeouts,
redirects, the concurrency limit, auth headers, TLS); the contract every kind keeps is
checked in ``tests/targets/contract/``."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

import tidings.targets.registry  # noqa: F401 - enters the target kinds into the config
from tests.support.certificates import TestCA
from tests.support.helpers import relay_config, statuses
from tests.support.waiting import wait_until
from tests.targets.kinds.webhook_support import HookServer
from tests.targets.makers import target_config, target_maker
from tidings.db import make_engine
from tidings.errors import TargetUnavailable
from tidings.events.outbox import OutboxEvent
from tidings.outbox.envelope import EventDraft, cloudevents_envelope
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.pipeline.relay import run_relay
from tidings.pipeline.relay_query import start_relay
from tidings.targets.kinds.webhook.answers import retry_after
from tidings.targets.kinds.webhook.cloudevent import header_value
from tidings.targets.kinds.webhook.target import WebhookTarget

LOGGED_AT = datetime(2024, 5, 17, 9, 30, 15, 123456, tzinfo=UTC)


@pytest.fixture
def server(hook_server: HookServer) -> HookServer:
    """The session's endpoint (``tests/targets/conftest.py``)."""
    return hook_server


@pytest.fixture
def make_target(server: HookServer) -> Iterator[Callable[..., WebhookTarget]]:
    yield from target_maker(
        lambda entry: WebhookTarget("hook", webhook_config(**entry)),
        {"url": f"{server.url}/hooks", "retry_backoff": "10ms"},
    )


def webhook_config(**entry: Any) -> Any:
    return target_config("hook", {"kind": "webhook", **entry})


def event(seq: int, act: str = "", key: str | None = None, **fields: Any) -> OutboxEvent:
    """An event as the default transformer publishes it (a CloudEvents envelope)."""
    event_id = str(uuid.uuid4())
    headers = {"act": act} if act else {}
    headers.update(fields.pop("headers", {}))
    draft = EventDraft(
        event_id=event_id,
        event_type=fields.pop("event_type", "order.created"),
        payload=fields.pop("data", {"n": seq}),
        logged_at=LOGGED_AT,
        version="1",
        originator="orders",
        partition_key=key,
        headers=headers,
    )
    payload = json.dumps(cloudevents_envelope(draft))
    return OutboxEvent(
        seq=seq,
        event_id=event_id,
        event_type=draft.event_type,
        payload=fields.pop("payload", payload),
        logged_at=LOGGED_AT,
        originator="orders",
        partition_key=key,
        headers=headers,
    )


# -- the request --------------------------------------------------------------------------


def test_binary_mode_sends_attributes_as_ce_headers_and_the_data_as_body(
    make_target: Callable[..., WebhookTarget], server: HookServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOK_AUTH", "Bearer s3cret-token")
    target = make_target(headers={"X-Team": "orders"}, headers_env={"Authorization": "HOOK_AUTH"})
    sent = event(1, key="order-7", headers={"tenant": "acme", "Trace Id": "é 1"})

    assert target.publish([sent]) == [None]

    (request,) = server.requests({sent.event_id})
    headers = request["headers"]
    assert headers["ce-specversion"] == "1.0"
    assert headers["ce-id"] == sent.event_id
    assert headers["ce-source"] == "orders"
    assert headers["ce-type"] == "order.created"
    assert headers["ce-time"] == LOGGED_AT.isoformat()
    assert headers["ce-subject"] == headers["ce-partitionkey"] == "order-7"
    assert headers["ce-tenant"] == "acme"
    assert json.loads(_unquote(headers["ce-tidingsheaders"])) == {"Trace Id": "é 1"}
    assert headers["content-type"] == "application/json"
    assert headers["idempotency-key"] == sent.event_id
    assert headers["authorization"] == "Bearer s3cret-token"
    assert headers["x-team"] == "orders"
    assert json.loads(request["body"]) == {"n": 1}
    assert request["path"] == "/hooks"


def _unquote(value: str) -> str:
    from urllib.parse import unquote

    return unquote(value)


def test_structured_mode_sends_the_envelope_as_it_was_emitted(
    make_target: Callable[..., WebhookTarget], server: HookServer
) -> None:
    target = make_target(mode="structured", idempotency_header="X-Event-Id")
    sent = event(1, key="k")

    assert target.publish([sent]) == [None]

    (request,) = server.requests({sent.event_id})
    assert request["headers"]["content-type"] == "application/cloudevents+json; charset=utf-8"
    assert request["headers"]["x-event-id"] == sent.event_id
    assert request["body"] == sent.payload  # not encoded again


def test_a_payload_that_is_no_envelope_is_the_data_of_the_row_s_attributes(
    make_target: Callable[..., WebhookTarget], server: HookServer
) -> None:
    """The ``identity`` transformer: the attributes come from the outbox row."""
    target = make_target(mode="structured", source="urn:shop:orders")
    sent = event(1, key="k", payload='{"total": 12.5}')
    binary = make_target()
    other = event(2, key="k", payload='{"total": 3}')

    assert target.publish([sent]) == [None]
    assert binary.publish([other]) == [None]

    (request,) = server.requests({sent.event_id})
    body = json.loads(request["body"])
    assert body["id"] == sent.event_id and body["source"] == "urn:shop:orders"
    assert body["type"] == "order.created" and body["data"] == {"total": 12.5}
    (request,) = server.requests({other.event_id})
    assert request["headers"]["ce-id"] == other.event_id
    assert request["body"] == '{"total": 3}'


def test_header_values_are_percent_encoded_as_the_binding_says() -> None:
    assert header_value("plain-value_1") == "plain-value_1"
    assert header_value('a b"c%d') == "a%20b%22c%25d"
    assert header_value("Ü") == "%C3%9C"


def test_retry_after_takes_seconds_or_an_http_date() -> None:
    now = time.time()
    assert retry_after("3") == 3.0
    assert retry_after(format_datetime(datetime.fromtimestamp(now + 20, UTC), usegmt=True), now)
    assert retry_after("soon") is None and retry_after(None) is None


# -- answers ------------------------------------------------------------------------------


def test_a_refused_event_names_the_status_and_a_bounded_part_of_the_body(
    make_target: Callable[..., WebhookTarget],
) -> None:
    """The endpoint's answer to a refused event is kept short in the error (the contract
    suite checks that it fails alone and stops its key)."""
    (error,) = make_target().publish([event(1, "refuse", key="b")])

    assert "refused: answered 422 Unprocessable" in error
    assert "order total is negative" in error and len(error) < 500


@pytest.mark.parametrize("status", [408, 429, 500, 503])
def test_a_status_that_asks_to_retry_is_sent_again_honouring_retry_after(
    make_target: Callable[..., WebhookTarget], server: HookServer, status: int
) -> None:
    target = make_target(retry_backoff="1ms")
    sent = event(1, f"{status}*2", key="k", headers={"retryafter": "1"})

    assert target.publish([sent]) == [None]

    tries = server.requests({sent.event_id})
    assert [r["status"] for r in tries] == [status, status, 200]


def test_retries_run_out_and_name_the_status(
    make_target: Callable[..., WebhookTarget], server: HookServer
) -> None:
    target = make_target(retries=2)
    sent = event(1, "always500", key="k")

    (error,) = target.publish([sent])

    assert "answered 500 Internal Server Error: boom (tried 3 times)" in error
    assert len(server.requests({sent.event_id})) == 3


def test_a_retry_after_over_the_bound_fails_the_event_at_once(
    make_target: Callable[..., WebhookTarget], server: HookServer
) -> None:
    target = make_target(max_retry_after="2s")
    sent = event(1, "503*1", key="k", headers={"retryafter": "120"})

    (error,) = target.publish([sent])

    assert "asked to retry after 120s, over max_retry_after (2s)" in error
    assert len(server.requests({sent.event_id})) == 1


def test_a_redirect_is_not_followed_but_refused(
    make_target: Callable[..., WebhookTarget], server: HookServer
) -> None:
    (error,) = make_target().publish([event(1, "moved")])
    assert "refused: answered 302 Found" in error


def test_an_endpoint_that_does_not_answer_in_time_is_unavailable(
    make_target: Callable[..., WebhookTarget],
) -> None:
    target = make_target(timeout="500ms")
    with pytest.raises(TargetUnavailable, match="ReadTimeout"):
        target.publish([event(1, "slow", key="a")])


def test_a_key_s_events_arrive_in_order_across_retries(
    make_target: Callable[..., WebhookTarget], server: HookServer
) -> None:
    target = make_target(retry_backoff="1ms")
    acts = ["", "503*2", "", "429*1", ""]
    events = [event(i, act, key="k") for i, act in enumerate(acts)]
    events += [event(10 + i, key=f"other{i}") for i in range(5)]

    assert target.publish(events) == [None] * len(events)

    arrived = [r["id"] for r in server.requests({e.event_id for e in events[:5]})]
    confirmed = [
        r["id"] for r in server.requests({e.event_id for e in events[:5]}) if r["status"] == 200
    ]
    assert confirmed == [e.event_id for e in events[:5]]
    # no event of the key was sent before the one ahead of it was confirmed
    assert arrived == [e.event_id for e in events[:5] for _ in range(1 + _fails(e))]


def _fails(sent: OutboxEvent) -> int:
    act = sent.headers.get("act", "")
    return int(act.split("*")[1]) if "*" in act else 0


def test_no_more_requests_are_in_flight_than_the_limit(
    make_target: Callable[..., WebhookTarget], server: HookServer
) -> None:
    target = make_target(max_concurrency=2)
    events = [event(i, "hold", key=f"k{i}") for i in range(8)]

    assert target.publish(events) == [None] * 8

    assert max(r["in_flight"] for r in server.requests({e.event_id for e in events})) <= 2


def test_tls_verified_against_the_configured_ca(tmp_path: Path) -> None:
    ca = TestCA(tmp_path / "pki")
    issued = ca.server()
    hook = HookServer(tmp_path, tls=(issued.cert, issued.key))
    hook.start()
    trusting = WebhookTarget("hook", webhook_config(url=hook.url, tls={"ca_file": str(ca.cert)}))
    untrusting = WebhookTarget("hook", webhook_config(url=hook.url))
    try:
        assert trusting.publish([event(1)]) == [None]
        with pytest.raises(TargetUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            untrusting.publish([event(2)])
    finally:
        trusting.close()
        untrusting.close()
        hook.kill()


# -- configuration ------------------------------------------------------------------------


def test_a_missing_auth_variable_makes_the_target_unavailable_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read at the first publish: a producer that builds the target for its emit-time
    refusals needs no credentials of the endpoint."""
    monkeypatch.delenv("HOOK_AUTH_MISSING", raising=False)
    headers_env = {"Authorization": "HOOK_AUTH_MISSING"}
    target = WebhookTarget(
        "hook", webhook_config(url="http://127.0.0.1:1/x", headers_env=headers_env)
    )
    try:
        assert target.refusal(event(1)) is None
        with pytest.raises(TargetUnavailable) as raised:
            target.publish([event(1)])
    finally:
        target.close()

    assert "headers_env.Authorization: the variable HOOK_AUTH_MISSING is not set" in str(
        raised.value
    )


# -- through the relay --------------------------------------------------------------------


@pytest.mark.spark
def test_the_relay_fails_only_the_refused_event(
    spark: Any, server: HookServer, tmp_path: Path
) -> None:
    target = {"kind": "webhook", "url": f"{server.url}/relay", "retry_backoff": "1ms"}
    config = relay_config(tmp_path, targets={"hook": target}, routes={"Created": ["hook"]})
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    for n, act in enumerate(["", "refuse", ""]):
        with outbox.transaction() as tx:
            tx.emit("Created", {"n": n}, partition_key=f"k{n}", headers={"act": act} if act else {})
    start_relay(spark, config, available_now=True).awaitTermination()

    assert statuses(engine) == {1: "PUBLISHED", 2: "FAILED", 3: "PUBLISHED"}
    with engine.connect() as conn:
        error = conn.execute(
            select(outbox_event.c.error_details).where(outbox_event.c.seq == 2)
        ).scalar_one()
    assert "answered 422" in error


KEYS = 6


class _Producer(threading.Thread):
    """Emits one event every few milliseconds, round-robin over the keys, until stopped."""

    def __init__(self, outbox: Outbox) -> None:
        super().__init__(daemon=True)
        self.outbox = outbox
        self.keys: dict[str, str] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            with self.outbox.transaction() as tx:
                key = f"k{i % KEYS}"
                self.keys[tx.emit("Moved", {"i": i}, partition_key=key)] = key
            i += 1
            time.sleep(0.01)


@pytest.mark.spark
@pytest.mark.slow
def test_the_endpoint_killed_and_restarted_under_traffic_loses_nothing_and_keeps_order(
    spark: Any, tmp_path: Path
) -> None:
    hook = HookServer(tmp_path)
    hook.start()
    config = relay_config(
        tmp_path,
        targets={"hook": {"kind": "webhook", "url": f"{hook.url}/in", "timeout": "2s"}},
        routes={"Moved": ["hook"]},
        replay_every=None,  # the streaming relay alone must resume the held keys
    )
    engine = make_engine(config.database.url)
    producer = _Producer(Outbox(engine))
    stop = threading.Event()
    relay = threading.Thread(target=run_relay, args=(spark, config), kwargs={"stop": stop})
    relay.start()
    try:
        producer.start()
        wait_until(lambda: list(statuses(engine).values()).count("PUBLISHED") >= 30)
        hook.kill()
        time.sleep(3)
        with engine.connect() as conn:
            charged = conn.execute(select(outbox_event.c.retry_count)).scalars().all()
        assert not any(charged)  # a down endpoint charges no retries
        hook.start()
        time.sleep(2)
        producer.stop.set()
        producer.join()
        total = len(producer.keys)
        wait_until(
            lambda: (
                len(statuses(engine)) == total and set(statuses(engine).values()) == {"PUBLISHED"}
            )
        )
    finally:
        producer.stop.set()
        stop.set()
        relay.join(60)
        hook.kill()
    with engine.connect() as conn:
        order = [r[0] for r in conn.execute(select(outbox_event.c.event_id).order_by("seq"))]
    arrived = [r["id"] for r in hook.requests() if r["status"] == 200]
    assert set(arrived) == set(order)  # nothing lost (a resend after a lost answer may repeat)
    for key in {f"k{i}" for i in range(KEYS)}:
        expected = [e for e in order if producer.keys[e] == key]
        assert _first_arrivals([e for e in arrived if producer.keys[e] == key]) == expected


def _first_arrivals(ids: list[str]) -> list[str]:
    seen: set[str] = set()
    return [i for i in ids if not (i in seen or seen.add(i))]
