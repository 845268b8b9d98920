"""FTN18 push over real WebSockets: seq order, groups in flight, acknowledgement by reply,
resending what was not acknowledged, live gaps, switching to polling, and consumers that
misbehave (never answer, disconnect mid-push, send garbage or huge frames)."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from tests.support.stream_helpers import (
    SEC,
    RawConsumer,
    add_events,
    call,
    poll,
    push_ids,
    serving,
    stream_server_config,
)
from tests.support.waiting import run

pytestmark = pytest.mark.sockets


def test_reliable_push_in_seq_order_with_two_groups_in_flight(database_url: str) -> None:
    config = stream_server_config(
        database_url, secure_channel=True, push={"max_group_events": 3, "group_delay": "1ms"}
    )

    async def scenario() -> None:
        async with serving(config) as server:
            ids = await add_events(server.url, 10)
            consumer = await RawConsumer.connect(server.ws_url)
            await consumer.start("P")
            first, second = await consumer.next_push(), await consumer.next_push()
            assert (first["p"]["seq"], second["p"]["seq"]) == (0, 1)
            assert push_ids(first) + push_ids(second) == ids[:6]
            await consumer.no_push()  # two groups in flight, and no more
            await consumer.ack(first, {})  # any reply that is not an error acknowledges
            third = await consumer.next_push()
            assert third["p"]["seq"] == 2 and push_ids(third) == ids[6:9]
            await consumer.ack(second)
            await consumer.close()
            # Acknowledged: the first two groups. The third comes again, from seq 0.
            again = await RawConsumer.connect(server.ws_url)
            await again.start("P")
            resent = await again.next_push()
            assert resent["p"]["seq"] == 0 and push_ids(resent) == ids[6:9]
            await again.ack(resent)
            last = await again.next_push()
            assert last["p"]["seq"] == 1 and push_ids(last) == ids[9:]
            await again.ack(last)
            [new] = await add_events(server.url, 1)
            live_one = await again.next_push()
            assert live_one["p"]["seq"] == 2 and push_ids(live_one) == [new]
            await again.ack(live_one)
            await again.close()
            # Switch to polling: it continues after what push had acknowledged.
            await asyncio.sleep(0.2)
            assert (await poll(server.url, "P"))["r"] == []

    run(scenario())


def test_push_filters_by_want(tmp_path) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            await add_events(server.url, 2, "ORDER")
            [pay] = await add_events(server.url, 1, "PAY")
            consumer = await RawConsumer.connect(server.ws_url)
            await consumer.start("W", want=["PAY"])
            push = await consumer.next_push()
            assert push_ids(push) == [pay]
            await consumer.ack(push)
            await add_events(server.url, 3, "ORDER")
            await consumer.no_push()
            [pay2] = await add_events(server.url, 1, "PAY")
            push = await consumer.next_push()
            assert push_ids(push) == [pay2] and push["p"]["seq"] == 1
            await consumer.close()

    run(scenario())


def test_ready_to_receive_refuses_a_want_of_types_the_stream_does_not_carry(tmp_path) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            await add_events(server.url, 1, "PAY")
            consumer = await RawConsumer.connect(server.ws_url)
            await consumer.request("registerConsumer", {"component": "W"})
            rid = await consumer.request("readyToReceive", {"component": "W", "want": ["PAYY"]})
            replies = [json.loads(await asyncio.wait_for(consumer.ws.recv(), 5)) for _ in "12"]
            assert replies[1] == {
                "e": "InvalidRequest",
                "edesc": "want: stream 's' does not carry PAYY (it carries ORDER, PAY, AUDIT; "
                "null wants them all)",
                "rid": rid,
            }
            await consumer.no_push()  # no session was started
            await consumer.close()

    run(scenario())


def test_polling_then_push_continues_from_the_acknowledged_position(tmp_path) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "S"})
            ids = await add_events(server.url, 4)
            await poll(server.url, "S", ids[1])  # acknowledges the first two
            consumer = await RawConsumer.connect(server.ws_url)
            await consumer.start("S")
            push = await consumer.next_push()
            assert push_ids(push) == ids[2:]
            await consumer.close()

    run(scenario())


def test_a_consumer_gone_mid_push_loses_nothing_and_harms_no_one(database_url: str) -> None:
    """FutoIn's own server crashed here (a WS closed while an onEvents call was pending)."""
    config = stream_server_config(database_url, secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            ids = await add_events(server.url, 5)
            bystander = await RawConsumer.connect(server.ws_url)
            await bystander.start("B")
            leaving = await RawConsumer.connect(server.ws_url)
            await leaving.start("G")
            assert push_ids(await leaving.next_push()) == ids
            leaving.ws.transport.abort()  # gone without a closing handshake
            push = await bystander.next_push()
            assert push_ids(push) == ids
            await bystander.ack(push)
            back = await RawConsumer.connect(server.ws_url)
            await back.start("G")
            resent = await back.next_push()
            assert resent["p"]["seq"] == 0 and push_ids(resent) == ids
            await back.ack(resent)
            more = await add_events(server.url, 2)
            assert (await back.collect(2))[0] == more
            assert (await bystander.collect(2))[0] == more
            await back.close()
            await bystander.close()

    run(scenario())


def test_a_consumer_that_never_answers_is_disconnected_alone(tmp_path) -> None:
    config = stream_server_config(
        f"sqlite:///{tmp_path}/e.db", secure_channel=True, push={"ack_timeout": "500ms"}
    )

    async def scenario() -> None:
        async with serving(config) as server:
            ids = await add_events(server.url, 3)
            silent = await RawConsumer.connect(server.ws_url)
            await silent.start("Q")
            await silent.next_push()
            other = await RawConsumer.connect(server.ws_url)
            await other.start("O")
            with pytest.raises(websockets.ConnectionClosed):
                for _ in range(20):
                    await silent.next_push(1.0)
            push = await other.next_push()
            assert push_ids(push) == ids
            await other.ack(push)
            again = await RawConsumer.connect(server.ws_url)
            await again.start("Q")
            assert push_ids(await again.next_push()) == ids  # never acknowledged: sent again
            await again.close()
            await other.close()

    run(scenario())


def test_a_refused_group_is_sent_again_after_reconnecting(tmp_path) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            ids = await add_events(server.url, 2)
            consumer = await RawConsumer.connect(server.ws_url)
            await consumer.start("R")
            push = await consumer.next_push()
            await consumer.ws.send(json.dumps({"e": "InternalError", "rid": push["rid"]}))
            with pytest.raises(websockets.ConnectionClosed):
                await consumer.next_push(5)
            again = await RawConsumer.connect(server.ws_url)
            await again.start("R")
            assert push_ids(await again.next_push()) == ids
            await again.close()

    run(scenario())


def test_live_push_starts_at_new_events_and_marks_skipped_groups_with_a_seq_gap(
    tmp_path,
) -> None:
    config = stream_server_config(
        f"sqlite:///{tmp_path}/e.db",
        secure_channel=True,
        push={"live_queue_events": 5, "max_group_events": 2, "max_in_flight": 1},
    )

    async def scenario() -> None:
        async with serving(config) as server:
            await add_events(server.url, 3)  # before the live consumer: not sent
            consumer = await RawConsumer.connect(server.ws_url)
            await consumer.start("LIVE")
            await asyncio.sleep(0.2)
            ids = await add_events(server.url, 2)
            received, seqs = await consumer.collect(2)
            assert received == ids and seqs == list(range(len(seqs)))
            [single] = await add_events(server.url, 1)
            waiting = await consumer.next_push()  # left unanswered while 20 more come
            assert push_ids(waiting) == [single]
            many = await add_events(server.url, 20)
            await consumer.ack(waiting)
            after = await consumer.next_push()
            gap = after["p"]["seq"] - waiting["p"]["seq"]
            assert gap == 2  # one seq skipped: the oldest waiting events were dropped
            assert push_ids(after)[0] >= many[-5] and push_ids(after)[-1] <= many[-1]
            await consumer.ack(after)
            await consumer.close()

    run(scenario())


def test_bad_frames_get_errors_and_the_connection_goes_on(tmp_path) -> None:
    config = stream_server_config(
        f"sqlite:///{tmp_path}/e.db", secure_channel=True, max_request_bytes=4096
    )

    async def scenario() -> None:
        async with serving(config) as server:
            consumer = await RawConsumer.connect(server.ws_url)
            for frame, name in [
                ("{oops", "InvalidRequest"),
                (
                    json.dumps(
                        {
                            "f": "futoin.evt.push:1.1:pollEvents",
                            "p": {"component": 3},
                            "rid": "C7",
                            "sec": SEC,
                        }
                    ),
                    "InvalidRequest",
                ),
                (
                    json.dumps(
                        {
                            "f": "futoin.evt.push:1.1:pollEvents",
                            "p": {"component": "X"},
                            "rid": "C8",
                            "sec": SEC,
                        }
                    ),
                    "NotRegistered",
                ),
                (
                    json.dumps(
                        {"f": "futoin.evt.gen:1.9:addEvent", "p": {}, "rid": "C9", "sec": SEC}
                    ),
                    "NotSupportedVersion",
                ),
            ]:
                await consumer.ws.send(frame)
                reply = json.loads(await asyncio.wait_for(consumer.ws.recv(), 5))
                assert reply["e"] == name, reply
            await consumer.ws.send(json.dumps({"r": True, "rid": "S99"}))  # answers nothing
            rid = await consumer.request("ping", {"echo": 5}, iface="futoin.evt.gen")
            reply = json.loads(await asyncio.wait_for(consumer.ws.recv(), 5))
            assert reply == {"r": {"echo": 5}, "rid": rid}
            huge = await RawConsumer.connect(server.ws_url)
            await huge.ws.send(b"x" * (64 * 1024))
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(huge.ws.recv(), 5)
            rid = await consumer.request("ping", {"echo": 6}, iface="futoin.evt.gen")
            assert json.loads(await asyncio.wait_for(consumer.ws.recv(), 5))["r"] == {"echo": 6}
            await consumer.close()

    run(scenario())


def test_pipelined_add_events_are_stored_in_request_order(database_url: str) -> None:
    config = stream_server_config(database_url, secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            producer = await RawConsumer.connect(server.ws_url)
            rids = []
            for index in range(200):  # sent without waiting for any reply
                params = {"type": "ORDER", "data": {"i": index}}
                rids.append(await producer.request("addEvent", params, iface="futoin.evt.gen"))
            replies = {}
            while len(replies) < len(rids):
                message = json.loads(await asyncio.wait_for(producer.ws.recv(), 10))
                replies[message["rid"]] = int(message["r"])
            ids = [replies[rid] for rid in rids]
            assert ids == sorted(ids) and len(set(ids)) == 200
            stored = (await poll(server.url, "LIVE", ids[0] - 1))["r"]
            assert [e["data"]["i"] for e in stored] == list(range(200))
            await producer.close()

    run(scenario(), timeout=60)
