"""Stream users' permissions over real HTTP and WebSockets: streams, components, types and
``addEvent`` allowed and refused by name, the refused connection going on with what is
allowed, the refusals counted; and the data filter at the generator in reliable and live
delivery, polled and pushed, with positions moving past what it holds back."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.stream_helpers import (
    BILLING,
    BILLING_SEC,
    RawConsumer,
    access_config,
    call,
    push_ids,
    serving,
)
from tests.support.waiting import run
from tidings.events.model import NewEvent, PayloadKind
from tidings.events.sources import Source, SourceKind
from tidings.server.store import EventStore

pytestmark = pytest.mark.sockets

REGISTER = "futoin.evt.poll:1.1:registerConsumer"
POLL = "futoin.evt.poll:1.1:pollEvents"
ADD = "futoin.evt.gen:1.1:addEvent"


async def billing(url: str, function: str, params: dict[str, Any]) -> dict[str, Any]:
    return await call(url, function, params, sec=BILLING_SEC)


async def add(url: str, event_type: str, tenant: str) -> int:
    """One event added by an unrestricted user; its id."""
    reply = await call(url, ADD, {"type": event_type, "data": {"tenant": tenant}})
    return int(reply["r"])


def _ids(reply: dict[str, Any]) -> list[int]:
    assert "r" in reply, reply
    return [int(event["id"]) for event in reply["r"]]


async def metrics(url: str) -> dict[str, float]:
    """The metrics at ``url`` (the server's endpoint): ``name{labels}`` -> value."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(url)).text
    found = re.findall(r"^(tidings_\S+) (\S+)$", text, re.MULTILINE)
    return {name: float(value) for name, value in found}


def position_of(values: dict[str, float], component: str, user: str = BILLING) -> float | None:
    key = f'tidings_stream_consumer_position{{component="{component}",stream="s",user="{user}"}}'
    return values.get(key)


def test_refusals_name_the_user_and_what_it_may_not_have(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = access_config(f"sqlite:///{tmp_path}/e.db")

    async def scenario() -> None:
        async with serving(config) as server:
            url, other = server.url, server.url.replace("/evt", "/other")

            def refused(description: str) -> dict[str, str]:
                return {"e": "Unauthorized", "edesc": description}

            assert await billing(other, REGISTER, {"component": "BILLING"}) == refused(
                "user 'billing' may not use stream 't'"
            )
            assert await billing(url, REGISTER, {"component": "AUDITOR"}) == refused(
                "user 'billing' may not consume stream 's' as component AUDITOR"
            )
            assert await billing(url, REGISTER, {"component": "BILLING"}) == {"r": True}
            assert await billing(url, POLL, {"component": "BILLING", "want": ["PAY"]}) == (
                refused(
                    "user 'billing' may not read PAY of stream 's' as component BILLING "
                    "(it may read ORDER)"
                )
            )
            assert await billing(url, POLL, {"component": "LIVE", "want": ["PAY"]}) == refused(
                "user 'billing' may not read PAY of stream 's' as component LIVE "
                "(it may read ORDER, AUDIT)"
            )
            # A type the stream does not carry is a mistake, not a refusal; the types listed
            # are those the user may read.
            assert await billing(url, POLL, {"component": "BILLING", "want": ["NOPE"]}) == {
                "e": "InvalidRequest",
                "edesc": "want: stream 's' does not carry NOPE (user 'billing' may read ORDER "
                "as component BILLING; null wants them all)",
            }
            assert await billing(url, ADD, {"type": "PAY", "data": {"tenant": "acme"}}) == (
                refused(
                    "user 'billing' may not add events of type PAY to stream 's' (it may add ORDER)"
                )
            )
            assert await billing(url, ADD, {"type": "ORDER", "data": {"tenant": "globex"}}) == (
                refused(
                    "user 'billing' may not add this ORDER event to stream 's': its data does "
                    'not pass the user\'s filter (/tenant = "acme")'
                )
            )
            added = await billing(url, ADD, {"type": "ORDER", "data": {"tenant": "acme"}})
            assert _ids(await billing(url, POLL, {"component": "BILLING"})) == [int(added["r"])]
            # The store knows who added it: the stream, for its user.
            store = EventStore(f"sqlite:///{tmp_path}/e.db")
            try:
                [order] = store.read(int(added["r"]) - 1, 1)
                assert store.sources_of([order.id]) == {
                    order.id: Source(SourceKind.STREAMS, 0, "s billing")
                }
            finally:
                store.close()
            wrong = await call(url, REGISTER, {"component": "BILLING"}, sec="billing:wrong")
            assert wrong["e"] == "SecurityError"
            # The same refusal again: counted, not logged again.
            for _ in range(3):
                await billing(url, REGISTER, {"component": "AUDITOR"})
            values = await metrics(server.metrics_url)
            counted = {
                reason: values.get(
                    f'tidings_stream_refusals_total{{reason="{reason}",stream="s",user="{user}"}}'
                )
                for reason, user in [
                    ("component", BILLING),
                    ("type", BILLING),
                    ("add_event", BILLING),
                    ("add_event_data", BILLING),
                    ("authentication", ""),
                    ("stream", BILLING),  # stream t's refusal counts on t
                ]
            }
            assert counted == {
                "component": 4.0,
                "type": 2.0,
                "add_event": 1.0,
                "add_event_data": 1.0,
                "authentication": 1.0,
                "stream": None,
            }

    with caplog.at_level(logging.WARNING, logger="tidings.streams"):
        run(scenario())
    logged = [r for r in caplog.records if r.getMessage().startswith("stream request refused")]
    assert sorted(r.reason for r in logged) == sorted(
        ["stream", "component", "type", "type", "add_event", "add_event_data", "authentication"]
    )
    assert all("billpass" not in r.getMessage() + str(r.__dict__) for r in caplog.records)
    assert any(
        "without an allow list" in r.getMessage() and r.users == ["ftn18", "other"]
        for r in caplog.records
    )


def test_a_refused_call_leaves_the_websocket_serving_what_is_allowed(tmp_path: Path) -> None:
    config = access_config(f"sqlite:///{tmp_path}/e.db")

    async def scenario() -> None:
        async with serving(config) as server:
            first = await add(server.url, "ORDER", "acme")
            consumer = await RawConsumer.connect(server.ws_url, BILLING_SEC)

            async def reply_to(rid: str) -> dict[str, Any]:
                while True:
                    message = json.loads(await asyncio.wait_for(consumer.ws.recv(), 5))
                    if message.get("rid") == rid:
                        return message

            rid = await consumer.request("registerConsumer", {"component": "AUDITOR"})
            assert (await reply_to(rid))["e"] == "Unauthorized"
            await consumer.start("BILLING")
            push = await consumer.next_push()
            assert push_ids(push) == [first]
            await consumer.ack(push)
            # A refused readyToReceive changes nothing: the running session goes on.
            rid = await consumer.request(
                "readyToReceive", {"component": "BILLING", "want": ["PAY"]}
            )
            assert (await reply_to(rid))["e"] == "Unauthorized"
            await add(server.url, "ORDER", "globex")
            second = await add(server.url, "ORDER", "acme")
            push = await consumer.next_push()
            assert push_ids(push) == [second] and push["p"]["seq"] == 1
            await consumer.ack(push)
            await consumer.close()

    run(scenario())


@pytest.mark.parametrize("push", [False, True], ids=["poll", "push"])
def test_the_data_filter_holds_back_events_and_positions_move_past_them(
    database_url: str, push: bool
) -> None:
    """billing as BILLING reads ORDER events of acme: globex's ORDER and acme's PAY are
    never sent, and count as delivered, so the stored position passes them (the trailing
    globex event included, else it would hold retention back for ever)."""
    config = access_config(database_url)

    async def scenario() -> None:
        async with serving(config) as server:
            url = server.url
            assert await billing(url, REGISTER, {"component": "BILLING"}) == {"r": True}
            ids = [
                await add(url, event_type, tenant)
                for event_type, tenant in [
                    ("ORDER", "acme"),
                    ("ORDER", "globex"),
                    ("PAY", "acme"),
                    ("ORDER", "acme"),
                    ("ORDER", "globex"),
                ]
            ]
            if push:
                consumer = await RawConsumer.connect(server.ws_url, BILLING_SEC)
                await consumer.start("BILLING")
                got, _ = await consumer.collect(2)
                assert got == [ids[0], ids[3]]
            else:
                assert _ids(await billing(url, POLL, {"component": "BILLING"})) == [ids[0], ids[3]]
                reply = await billing(url, POLL, {"component": "BILLING", "last_id": str(ids[3])})
                assert _ids(reply) == []

            async def position() -> float:
                return position_of(await metrics(server.metrics_url), "BILLING") or 0

            # Past the trailing globex event (and, it may be, past the servers' own
            # consumer events after it, which no consumer reads).
            deadline = asyncio.get_running_loop().time() + 10
            while await position() < ids[4]:
                assert asyncio.get_running_loop().time() < deadline, await position()
                await asyncio.sleep(0.05)
            later = [await add(url, "ORDER", t) for t in ("globex", "acme", "globex")]
            if push:
                pushed = await consumer.next_push()
                assert push_ids(pushed) == [later[1]]
                await consumer.ack(pushed)
                await consumer.close()
            else:
                assert _ids(await billing(url, POLL, {"component": "BILLING"})) == [later[1]]

    run(scenario())


def test_live_consumers_get_only_what_the_filter_passes(tmp_path: Path) -> None:
    config = access_config(f"sqlite:///{tmp_path}/e.db")

    async def scenario() -> None:
        async with serving(config) as server:
            url = server.url
            old = [await add(url, "ORDER", t) for t in ("acme", "globex", "all", "globex")]
            newest = await billing(url, POLL, {"component": "LIVE"})
            assert _ids(newest) == [old[0], old[2]]
            after = await billing(url, POLL, {"component": "LIVE", "last_id": str(old[0])})
            assert _ids(after) == [old[2]]
            live = await RawConsumer.connect(server.ws_url, BILLING_SEC)
            await live.start("LIVE")
            await asyncio.sleep(0.2)  # the session is running: it starts at new events
            new = [await add(url, "ORDER", t) for t in ("globex", "acme", "globex", "all")]
            got: list[int] = []
            while len(got) < 2:
                push = await live.next_push()
                got += push_ids(push)
                await live.ack(push)
            assert got == [new[1], new[3]]
            await live.no_push()
            await live.close()

    run(scenario())


def test_a_consumer_far_behind_reads_the_store_through_the_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events stored before the server started are read from the store, not the feed. A
    read whose events the filter all holds back reads on (two reads of 1,000 here), and one
    that finds none within its reads still moves the position past what it looked at; a
    LIVE poll reads on until it finds one."""
    monkeypatch.setattr("tidings.streams.service.reader.MAX_STORE_READS", 2)
    url = f"sqlite:///{tmp_path}/e.db"
    store = EventStore(url)

    def orders(tenant: str, count: int) -> None:
        data = json.dumps({"tenant": tenant}).encode()
        store.register([NewEvent(("orders", "created"), data, PayloadKind.JSON)] * count)

    orders("globex", 1500)
    orders("acme", 2)
    orders("globex", 2500)
    orders("acme", 1)
    store.close()

    async def scenario() -> None:
        async with serving(access_config(url)) as server:
            await billing(server.url, REGISTER, {"component": "BILLING"})
            assert _ids(await billing(server.url, POLL, {"component": "BILLING"})) == [
                1501,
                1502,
            ]
            # A LIVE poll has no position to move: it reads on to the next event it may see.
            live = await billing(server.url, POLL, {"component": "LIVE", "last_id": "1502"})
            assert _ids(live) == [4003]
            reply = await billing(server.url, POLL, {"component": "BILLING", "last_id": "1502"})
            assert _ids(reply) == []  # 2,000 looked at, none for billing
            assert position_of(await metrics(server.metrics_url), "BILLING") == 3502
            assert _ids(await billing(server.url, POLL, {"component": "BILLING"})) == [4003]
            newest = await billing(server.url, POLL, {"component": "LIVE"})
            assert _ids(newest) == [4003]  # of the newest 1,000, the one it may read

    run(scenario())


def test_a_user_without_permissions_for_a_stream_cannot_push_or_generate_there(
    tmp_path: Path,
) -> None:
    """``allow: []``: the user authenticates, and may do nothing."""
    config = access_config(f"sqlite:///{tmp_path}/e.db")
    config["stream_users"][BILLING]["allow"] = []

    async def scenario() -> None:
        async with serving(config) as server:
            consumer = await RawConsumer.connect(server.ws_url, BILLING_SEC)
            rid = await consumer.request("readyToReceive", {"component": "LIVE"})
            reply = json.loads(await asyncio.wait_for(consumer.ws.recv(), 5))
            assert reply == {
                "e": "Unauthorized",
                "edesc": "user 'billing' may not use stream 's'",
                "rid": rid,
            }
            await add(server.url, "ORDER", "acme")
            await consumer.no_push()
            await consumer.close()
            added = await billing(server.url, ADD, {"type": "ORDER", "data": {}})
            assert added["e"] == "Unauthorized"

    run(scenario())
