"""An intermediary's Prometheus metrics and its limits per client address (issue 30), over
real sockets: the server on a free port, its /metrics endpoint scraped over HTTP, real
WebSocket clients doing what each counter counts. The other client address is 127.0.0.2:
Linux routes all of 127/8 to the loopback interface, so a client socket bound to it reaches
the server from an address of its own. No test asserts timings: waits are bounded only so
that a broken build fails instead of hanging."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families

from tests.intermediary.serving.test_transport import WAIT, Rig, slow_subscriber, until
from tests.support.chain_helpers import ChainRig, chain_rig
from tests.support.intermediary_helpers import SMALL
from tests.support.server_helpers import running
from tidings.client import connect, json_event
from tidings.config.intermediary_access import SubscriberAccess
from tidings.config.passwords import PasswordBook, hash_password, hash_token, new_token
from tidings.errors import AccessRefused, SubscriptionRefused
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.serving.access import Gatekeeper
from tidings.intermediary.serving.addresses import LoginThrottle
from tidings.intermediary.serving.counters import REFUSALS
from tidings.intermediary.serving.credentials import Credentials
from tidings.intermediary.serving.envelope import FULL_CLOSE_CODE
from tidings.intermediary.serving.metrics import IntermediaryMetrics
from tidings.intermediary.serving.transport import TransportLimits

pytestmark = pytest.mark.sockets

TOKEN = new_token()
PASSWORD = "correct horse"
ACCESS = SubscriberAccess.model_validate(
    {
        "anonymous": {"allowed_from": "nowhere"},
        "subscribers": {
            "dash": {"token_hash": hash_token(TOKEN), "events": [["app", "*"]], "tables": []},
            "ops": {"password_hash": hash_password(PASSWORD, n=2**4), "tables": ["*"]},
        },
    }
)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(metrics: IntermediaryMetrics) -> Samples:
    """Every sample of the endpoint: (name, sorted labels) -> value."""
    async with httpx.AsyncClient() as http:
        response = await http.get(f"http://127.0.0.1:{metrics.port}/metrics", timeout=WAIT)
    response.raise_for_status()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def refusals(samples: Samples) -> dict[str, float]:
    return {
        dict(labels)["reason"]: value
        for (name, labels), value in samples.items()
        if name == "tidings_intermediary_refusals_total"
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def raw(url: str, source: str = "127.0.0.1", **options: Any) -> Any:
    """A raw WebSocket client whose socket is bound to ``source`` (its hello read)."""
    client = await websockets.connect(url, **_from(source), **options)
    json.loads(await client.recv())
    return client


def _from(source: str) -> dict[str, Any]:
    return {"local_addr": (source, 0)}


async def reply(client: Any, request: object) -> dict[str, Any]:
    await client.send(request if isinstance(request, str | bytes) else json.dumps(request))
    while not isinstance(message := await client.recv(), str):
        pass
    answer: dict[str, Any] = json.loads(message)
    return answer


def test_every_refusal_reason_is_listed_at_0_and_the_transport_counters_move() -> None:
    """Each of the transport's counters moves when its cause happens: frames sent, region
    subscriptions, malformed, too deep, invalid, rate limited, too large (1009), too many
    connections (1013), frames dropped and a slow subscriber dropped."""

    async def body(rig: Rig) -> None:
        metrics = IntermediaryMetrics(rig.server, "127.0.0.1", 0)
        try:
            before = await scrape(metrics)
            assert set(refusals(before)) == set(REFUSALS)
            assert set(refusals(before).values()) == {0.0}
            assert value(before, "tidings_intermediary_subscribers") == 0

            good = await IntermediaryClient.connect(rig.url)
            await good.subscribe("k", SMALL, rate_hz=100)
            frames = [f async for f in _take(good, 3)]
            assert frames
            now = await scrape(metrics)
            assert value(now, "tidings_intermediary_subscribers") == 1
            assert value(now, "tidings_intermediary_subscriptions", kind="region") == 1
            assert value(now, "tidings_intermediary_frames_sent_total") >= 3

            bad = await raw(rig.url)
            assert (await reply(bad, b"\x00"))["message"].startswith("request: expected a JSON")
            assert "not JSON" in (await reply(bad, "{"))["message"]
            assert "nested too deeply" in (await reply(bad, "[" * 2000 + "]" * 2000))["message"]
            assert "op:" in (await reply(bad, {"op": "nope"}))["message"]
            answers = [await reply(bad, {"op": "unsubscribe", "key": "x"}) for _ in range(12)]
            assert any("too many requests" in a.get("message", "") for a in answers)
            full = await websockets.connect(rig.url)  # max_connections is 2: good and bad
            await full.wait_closed()
            assert full.close_code == FULL_CLOSE_CODE
            await bad.send("x" * 5000)
            await bad.wait_closed()
            assert bad.close_code == 1009
            await until(lambda: len(rig.server.connections) == 1)
            counted = refusals(await scrape(metrics))
            assert counted["malformed"] == 2 and counted["too_deep"] == 1
            assert counted["invalid"] == 1 and counted["rate_limited"] >= 1
            assert counted["too_large"] == 1 and counted["too_many_connections"] == 1
            assert counted["bad_credentials"] == 0 and counted["not_granted"] == 0

            slow, _ = await slow_subscriber(rig)
            await until(lambda: bool(rig.server.disconnects))
            after = await scrape(metrics)
            assert value(after, "tidings_intermediary_subscribers_dropped_total") == 1
            assert value(after, "tidings_intermediary_frames_dropped_total", cause="not_ready") > 0
            assert "tidings_intermediary_upstream_connected" not in {n for n, _ in after}
            await slow.close()
            await good.close()
        finally:
            metrics.close()

    _run(body, n=400, max_dropped=3, limits=_limits(max_connections=2))


async def _take(client: IntermediaryClient, count: int) -> AsyncIterator[Any]:
    seen = 0
    async for frame in client.frames():
        yield frame
        seen += 1
        if seen == count:
            return


def _limits(**values: Any) -> TransportLimits:
    return TransportLimits(
        max_message_bytes=4096, burst=10, requests_per_s=1e-3, send_buffer_bytes=4096, **values
    )


def _run(body: Any, **options: Any) -> None:
    async def main() -> None:
        rig = Rig(**options)
        await rig.server.start()
        try:
            await asyncio.wait_for(body(rig), WAIT)
        finally:
            await rig.server.aclose()

    asyncio.run(main())


@asynccontextmanager
async def _chained(
    tmp_path: Path, gate: Gatekeeper, limits: TransportLimits | None = None
) -> AsyncIterator[tuple[ChainRig, Any, IntermediaryMetrics]]:
    async with (
        running(tmp_path) as srv,
        chain_rig(srv.address, access=gate, limits=limits) as rig,
        await connect(srv.address) as producer,
    ):
        metrics = IntermediaryMetrics(rig.server, "127.0.0.1", 0)
        try:
            yield rig, producer, metrics
        finally:
            metrics.close()


def test_access_views_and_upstream_metrics_move(tmp_path: Path) -> None:
    """Bad credentials, anonymous and not granted are counted; event and view subscriptions
    by kind; JSON messages sent; the event server upstream connected and not stale."""
    gate = Gatekeeper.from_config(ACCESS)

    async def main() -> None:
        async with _chained(tmp_path, gate) as (rig, producer, metrics):
            with pytest.raises(AccessRefused):
                await rig.client()
            with pytest.raises(AccessRefused):
                await rig.client(credentials=Credentials(token=new_token()))
            with pytest.raises(AccessRefused):
                await rig.client(credentials=Credentials(user="ops", password="wrong-1"))
            ops = await rig.client(credentials=Credentials(user="ops", password=PASSWORD))
            dash = await rig.client(credentials=Credentials(token=TOKEN))
            await dash.subscribe_events("a", [["app", "*"]])
            await ops.subscribe_sql("v", "SELECT id FROM users")
            with pytest.raises(SubscriptionRefused):
                await dash.subscribe_sql("u", "SELECT id FROM users")
            await producer.register([json_event(("app", "x"), "hello")])
            while (await dash.message(WAIT)).get("payload") != "hello":
                pass
            samples = await scrape(metrics)
            counted = refusals(samples)
            assert counted["anonymous"] == 1 and counted["bad_credentials"] == 2
            assert counted["not_granted"] == 1
            assert value(samples, "tidings_intermediary_subscriptions", kind="event") == 1
            assert value(samples, "tidings_intermediary_subscriptions", kind="view") == 1
            assert value(samples, "tidings_intermediary_subscribers") == 2
            assert value(samples, "tidings_intermediary_messages_sent_total") >= 1
            upstream = "event_server"
            assert value(samples, "tidings_intermediary_upstream_connected", upstream=upstream) == 1
            assert value(samples, "tidings_intermediary_upstream_stale", upstream=upstream) == 0
            await dash.close()
            await ops.close()

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_one_address_gets_n_connections_and_the_next_is_refused_while_another_gets_in(
    tmp_path: Path,
) -> None:
    gate = Gatekeeper.from_config(SubscriberAccess())  # anonymous from loopback (all of 127/8)

    async def main() -> None:
        limits = TransportLimits(max_connections_per_address=2)
        async with _chained(tmp_path, gate, limits) as (rig, _, metrics):
            held = [await raw(rig.url), await raw(rig.url)]
            # Closed at TCP accept (tidings.accept), before a byte of HTTP is read.
            with pytest.raises((websockets.InvalidMessage, ConnectionError)):
                await websockets.connect(rig.url)
            other = await raw(rig.url, "127.0.0.2")  # another address: its own seats
            assert refusals(await scrape(metrics))["too_many_from_address"] == 1
            await held[0].close()
            await until(lambda: rig.server.addresses.held("127.0.0.1") == 1)
            again = await raw(rig.url)  # a seat given back is a seat again
            for client in (*held, other, again):
                await client.close()

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_an_address_failing_logins_is_throttled_without_hashing_while_another_logs_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After 3 wrong passwords from 127.0.0.1, its handshakes are refused with 429 (and
    Retry-After), even with the right password, and no password is hashed for it; 127.0.0.2
    logs in meanwhile. The scrypt checks are counted by wrapping the real
    ``PasswordBook.check`` (it still runs): how many ran is no observable of a real part."""
    checks: list[str] = []
    check = PasswordBook.check

    def counted(self: PasswordBook, name: str, password: str) -> bool:
        checks.append(name)
        return check(self, name, password)

    monkeypatch.setattr(PasswordBook, "check", counted)
    gate = Gatekeeper.from_config(ACCESS, throttle=LoginThrottle(3, 600.0, 600.0))
    wrong = Credentials(user="ops", password="not-it")
    right = Credentials(user="ops", password=PASSWORD)

    async def main() -> None:
        async with _chained(tmp_path, gate) as (rig, _, metrics):
            for _ in range(3):
                with pytest.raises(AccessRefused) as refused:
                    await rig.client(credentials=wrong)
                assert refused.value.status == 401
            hashed = len(checks)
            for credentials in (wrong, right, None):
                with pytest.raises(AccessRefused) as throttled:
                    await rig.client(credentials=credentials)
                assert throttled.value.status == 429
                assert "too many failed logins from 127.0.0.1" in str(throttled.value)
                assert throttled.value.retry_after_s is not None
            assert len(checks) == hashed  # nothing hashed for the throttled address
            async with httpx.AsyncClient() as http:  # /auth is no way around it
                auth = await http.get(f"http://127.0.0.1:{rig.server.port}/auth")
            assert auth.status_code == 429 and "Retry-After" in auth.headers
            ops = await rig.client(credentials=right, **_from("127.0.0.2"))
            assert ops.identity == "ops"
            samples = await scrape(metrics)
            counted = refusals(samples)
            assert counted["bad_credentials"] == 3 and counted["login_throttled"] == 4
            assert value(samples, "tidings_intermediary_login_blocks_total") == 1
            await ops.close()

    asyncio.run(asyncio.wait_for(main(), WAIT))
