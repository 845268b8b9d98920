"""The real FutoIn client (futoin-eventstream 1.3.9 from npm, run by Node) against tidings'
streams: ReliableReceiver, LiveReceiver and PollFace unchanged, GenFace for addEvent, and
the errors it must see by name."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.stream_helpers import (
    BILLING_SEC,
    SEC,
    FutoInClient,
    access_config,
    add_events,
    call,
    futoin,
    serving,
    stream_server_config,
)
from tests.support.waiting import run, until

pytestmark = pytest.mark.sockets


def _ids(events: list[dict]) -> list[int]:
    return [int(event["id"]) for event in events]


def test_futoin_generates_and_polls_over_http_and_websocket(database_url: str) -> None:
    config = stream_server_config(database_url, secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            gen_ws = await futoin(
                mode="gen", url="secure+" + server.ws_url, creds=SEC, type="ORDER", count=3
            )
            gen_http = await futoin(
                mode="gen", url="secure+" + server.url, creds=SEC, type="PAY", count=2
            )
            ids = [
                int(line["result"]) for line in gen_ws.lines + gen_http.lines if "result" in line
            ]
            assert len(ids) == 5 and ids == sorted(ids)
            for url, version in [
                (server.url, "1.1"),
                (server.ws_url, "1.1"),
                (server.ws_url, "1.0"),
            ]:
                polled = await futoin(
                    mode="poll",
                    url=url,
                    creds=SEC,
                    component="P" + version[-1] + url[:2],
                    count=5,
                    version=version,
                )
                assert _ids(polled.events) == ids, (url, version, polled.lines)
            payments = await futoin(
                mode="poll", url=server.url, creds=SEC, component="PAYS", count=2, want=["PAY"]
            )
            assert [e["type"] for e in payments.events] == ["PAY", "PAY"]

    run(scenario(), timeout=90)


def test_futoin_reliable_receiver_gets_every_event_once_in_order(database_url: str) -> None:
    config = stream_server_config(database_url, secure_channel=True, push={"max_group_events": 7})

    async def scenario() -> None:
        async with serving(config) as server:
            before = await add_events(server.url, 20)
            receiver = await FutoInClient(
                mode="reliable", url=server.ws_url, creds=SEC, component="REL", count=40
            ).start()
            try:
                await receiver.wait_ready()
                after = await add_events(server.url, 20)
                await receiver.wait_events(40)
                assert _ids(receiver.events) == before + after
                assert await receiver.finish() == 0
            finally:
                await receiver.kill()

    run(scenario(), timeout=90)


def test_futoin_reliable_receiver_killed_mid_group_resumes_without_loss_or_duplicate(
    database_url: str,
) -> None:
    config = stream_server_config(database_url, secure_channel=True, push={"max_group_events": 10})

    async def scenario() -> None:
        async with serving(config) as server:
            ids = await add_events(server.url, 50)
            first = await FutoInClient(
                mode="reliable", url=server.ws_url, creds=SEC, component="K", crash_after=25
            ).start()
            assert await first.finish() == 9  # exited before acknowledging a group
            assert 0 < len(first.events) <= 25
            second = await futoin(
                mode="reliable",
                url=server.ws_url,
                creds=SEC,
                component="K",
                count=len(ids) - len(first.events),
            )
            assert _ids(first.events) + _ids(second.events) == ids

    run(scenario(), timeout=90)


def test_futoin_receivers_filter_by_want(tmp_path) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            await add_events(server.url, 3, "ORDER")
            pays = await add_events(server.url, 2, "PAY")
            receiver = await futoin(
                mode="reliable",
                url=server.ws_url,
                creds=SEC,
                component="WANT",
                want=["PAY"],
                count=2,
            )
            assert _ids(receiver.events) == pays

    run(scenario(), timeout=60)


def test_futoin_live_receiver_gets_new_events(tmp_path) -> None:
    """FutoIn's stock live receiver replies {} (no result), which FutoIn's own server refuses
    and then stalls; any non-error reply counts here."""
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            await add_events(server.url, 5)  # old: a live consumer starts after them
            live = await FutoInClient(mode="live", url=server.ws_url, creds=SEC, count=30).start()
            try:
                await live.wait_ready()
                await asyncio.sleep(0.2)
                ids = []
                for _ in range(3):  # several groups: the {} replies keep it going
                    ids += await add_events(server.url, 10)
                    await asyncio.sleep(0.05)
                await live.wait_events(30)
                assert _ids(live.events) == ids
            finally:
                await live.kill()

    run(scenario(), timeout=60)


def test_futoin_sees_the_ftn18_errors_by_name(tmp_path) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db")

    async def scenario() -> None:
        async with serving(config) as server:
            cases = [
                (
                    {"iface": "poll", "func": "pollEvents", "params": {"component": "NOPE"}},
                    SEC,
                    "NotRegistered",
                ),
                (
                    {"iface": "poll", "func": "registerConsumer", "params": {"component": "LIVE"}},
                    SEC,
                    "LiveNotAllowed",
                ),
                (
                    {"iface": "poll", "func": "registerConsumer", "params": {"component": "X"}},
                    "ftn18:bad",
                    "SecurityError",
                ),
                # gen requires a secure channel; this stream is plain
                (
                    {
                        "iface": "gen",
                        "func": "addEvent",
                        "params": {"type": "ORDER", "data": 1},
                        "url": "secure+" + server.url,
                    },
                    SEC,
                    "SecurityError",
                ),
            ]
            for options, creds, name in cases:
                client = await futoin(mode="call", creds=creds, **({"url": server.url} | options))
                assert [line["error"] for line in client.errors] == [name], client.lines

    run(scenario(), timeout=60)


def test_futoin_reliable_receiver_reconnects_across_a_server_restart(tmp_path) -> None:
    """FutoIn's receiver reconnects at once, into the restart's gap; that attempt's call
    then waits for the client's 30 s call timeout before it retries (its behaviour, seen in
    its log lines), so this test takes ~30 s."""
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            url = server.url
            before = await add_events(url, 10)
            receiver = await FutoInClient(
                mode="reliable", url=server.ws_url, creds=SEC, component="RECON", count=20
            ).start()
            await receiver.wait_events(10)
            await asyncio.sleep(0.3)  # its acknowledgement arrives
        try:
            async with serving(config):  # same port: the receiver reconnects by itself
                after = await add_events(url, 10)
                await receiver.wait_events(20, timeout=30)
                assert _ids(receiver.events) == before + after
        finally:
            await receiver.kill()

    run(scenario(), timeout=90)


def test_futoin_sees_refusals_as_unauthorized_and_only_what_the_filter_passes(
    tmp_path,
) -> None:
    """billing (:func:`access_config`): refused components and types reach FutoIn's client
    as FTN3's Unauthorized; its receivers get only the events of tenant acme."""
    config = access_config(f"sqlite:///{tmp_path}/e.db")

    async def scenario() -> None:
        async with serving(config) as server:
            ids = []
            for tenant in ("globex", "acme", "globex", "acme", "globex"):
                reply = await call(
                    server.url,
                    "futoin.evt.gen:1.1:addEvent",
                    {"type": "ORDER", "data": {"tenant": tenant}},
                )
                ids.append(int(reply["r"]))
            acme = [ids[1], ids[3]]
            polled = await futoin(
                mode="poll", url=server.url, creds=BILLING_SEC, component="BILLP", count=2
            )
            assert _ids(polled.events) == acme
            pushed = await futoin(
                mode="reliable", url=server.ws_url, creds=BILLING_SEC, component="BILLR", count=2
            )
            assert _ids(pushed.events) == acme
            for options in [
                {"iface": "poll", "func": "registerConsumer", "params": {"component": "AUDITOR"}},
                {
                    "iface": "poll",
                    "func": "pollEvents",
                    "params": {"component": "BILLP", "want": ["PAY"]},
                },
                {
                    "iface": "gen",
                    "func": "addEvent",
                    "params": {"type": "ORDER", "data": {"tenant": "globex"}},
                    "url": "secure+" + server.url,
                },
            ]:
                client = await futoin(
                    mode="call", creds=BILLING_SEC, **({"url": server.url} | options)
                )
                assert [line["error"] for line in client.errors] == ["Unauthorized"], client.lines
            generated = await futoin(
                mode="gen",
                url="secure+" + server.ws_url,
                creds=BILLING_SEC,
                type="ORDER",
                data={"tenant": "acme"},
            )
            assert [line["result"] for line in generated.lines if "result" in line]
            refused = await FutoInClient(
                mode="reliable", url=server.ws_url, creds=BILLING_SEC, component="AUDITOR"
            ).start()
            try:
                await until(lambda: bool(refused.errors), 20)
                assert refused.errors[0]["error"] == "Unauthorized", refused.lines
                assert not refused.events
            finally:
                await refused.kill()

    run(scenario(), timeout=90)
