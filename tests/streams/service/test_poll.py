"""FTN18 streams over real HTTP on both backends: registration, polling, acknowledgement,
filters, limits, users, generation and the errors of each."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest

from tests.support.stream_helpers import (
    OTHER_PASSWORD,
    OTHER_USER,
    SEC,
    add_events,
    call,
    poll,
    serving,
    stream_server_config,
)
from tests.support.waiting import run
from tidings.events.model import NewEvent, PayloadKind
from tidings.server.store import EventStore

pytestmark = pytest.mark.sockets


def _ids(reply: dict) -> list[int]:
    assert "r" in reply, reply
    return [int(event["id"]) for event in reply["r"]]


def test_register_poll_acknowledge_and_resume_after_restart(database_url: str) -> None:
    config = stream_server_config(database_url, secure_channel=True)

    async def first() -> list[int]:
        async with serving(config) as server:
            assert await call(
                server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "A"}
            ) == {"r": True}
            again = await call(
                server.url, "futoin.evt.poll:1.0:registerConsumer", {"component": "A"}
            )
            assert again == {"r": True}  # registering again is fine
            ids = await add_events(server.url, 5)
            assert ids == sorted(ids) and len(set(ids)) == 5
            reply = await poll(server.url, "A")
            assert _ids(reply) == ids
            event = reply["r"][0]
            assert event["type"] == "ORDER" and event["data"] == {"i": 0}
            assert len(event["ts"]) == 20 and event["ts"].endswith("Z")
            assert _ids(await poll(server.url, "A", ids[2])) == ids[3:]  # acknowledges ids[2]
            assert _ids(await poll(server.url, "A", ids[0])) == ids[3:]  # never moves back
            return ids

    ids = run(first())

    async def after_restart() -> None:
        async with serving(config) as server:
            assert _ids(await poll(server.url, "A")) == ids[3:]
            assert _ids(await poll(server.url, "A", ids[4])) == []

    run(after_restart())


def test_want_filters_at_the_generator_and_skipped_events_count_as_delivered(
    database_url: str,
) -> None:
    async def scenario() -> None:
        async with serving(stream_server_config(database_url, secure_channel=True)) as server:
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "F"})
            [order1] = await add_events(server.url, 1, "ORDER")
            [pay] = await add_events(server.url, 1, "PAY")
            [order2] = await add_events(server.url, 1, "ORDER")
            reply = await poll(server.url, "F", want=["PAY"])
            assert _ids(reply) == [pay] and reply["r"][0]["type"] == "PAY"
            # Acknowledging the PAY event and finding nothing wanted after it moves the
            # position past order2: a poll without a filter no longer gets it.
            assert _ids(await poll(server.url, "F", pay, want=["PAY"])) == []
            assert _ids(await poll(server.url, "F")) == []
            assert order1 < pay < order2
            [order3] = await add_events(server.url, 1, "ORDER")
            # A want naming a type the stream does not carry is refused, and skips nothing: a
            # typo must not acknowledge every event as not wanted (see the test below).
            refused = await poll(server.url, "F", want=["NOPE_TYPE"])
            assert (
                refused["e"] == "InvalidRequest" and "does not carry NOPE_TYPE" in refused["edesc"]
            )
            assert _ids(await poll(server.url, "F", want=["ORDER", "PAY"])) == [order3]
            assert order3 > order2

    run(scenario())


@pytest.mark.parametrize(
    ("want", "refused"),
    [
        (["NOPE_TYPE"], "does not carry NOPE_TYPE"),
        (["ORDER", "NOPE_TYPE", "NEVER"], "does not carry NOPE_TYPE, NEVER"),
        ([], "got an empty list"),
    ],
    ids=["unknown", "one-good-two-unknown", "empty"],
)
def test_a_want_of_types_the_stream_does_not_carry_is_refused_naming_those_it_does(
    tmp_path, want: list[str], refused: str
) -> None:
    """Such a consumer would wait in silence for what never comes; the refusal moves no
    position (the next poll still gets the event)."""
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)

    async def scenario() -> None:
        async with serving(config) as server:
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "F"})
            [order] = await add_events(server.url, 1, "ORDER")
            reply = await poll(server.url, "F", want=want)
            assert reply == {
                "e": "InvalidRequest",
                "edesc": f"want: stream 's' {refused} (it carries ORDER, PAY, AUDIT; "
                "null wants them all)",
            }
            assert _ids(await poll(server.url, "F", want=["ORDER"])) == [order]

    run(scenario())


def test_poll_replies_keep_to_1000_events_and_the_version_size_limit(tmp_path) -> None:
    """1.1 declares maxrspsize 8M, 1.0 does not (64 KiB); FTN18 lists hold up to 1000."""
    url = f"sqlite:///{tmp_path}/events.db"
    data = json.dumps({"blob": "x" * 1000}).encode()
    store = EventStore(url)
    store.register([NewEvent(("orders", "created"), data, PayloadKind.JSON)] * 1500)
    store.close()

    async def scenario() -> None:
        async with serving(stream_server_config(url)) as server:
            for version in ("1.0", "1.1"):
                function = f"futoin.evt.poll:{version}:registerConsumer"
                await call(server.url, function, {"component": "V" + version[-1]})
            async with httpx.AsyncClient() as client:
                sizes = {}
                for version in ("1.0", "1.1"):
                    message = {
                        "f": f"futoin.evt.poll:{version}:pollEvents",
                        "p": {"component": "V" + version[-1]},
                        "sec": SEC,
                    }
                    response = await client.post(server.url, content=json.dumps(message))
                    sizes[version] = (len(response.content), len(response.json()["r"]))
            assert sizes["1.1"][1] == 1000
            assert sizes["1.0"][0] <= 64 * 1024 and 0 < sizes["1.0"][1] < 1000

    run(scenario())


def test_a_user_acts_only_on_its_own_components(database_url: str) -> None:
    async def scenario() -> None:
        async with serving(stream_server_config(database_url, secure_channel=True)) as server:
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "C"})
            ids = await add_events(server.url, 3)
            other = f"{OTHER_USER}:{OTHER_PASSWORD}"
            reply = await call(
                server.url, "futoin.evt.poll:1.1:pollEvents", {"component": "C"}, sec=other
            )
            assert reply["e"] == "NotRegistered"
            await call(
                server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "C"}, sec=other
            )
            await poll(server.url, "C", ids[2])  # the first user's C acknowledges all
            reply = await call(
                server.url, "futoin.evt.poll:1.1:pollEvents", {"component": "C"}, sec=other
            )
            assert _ids(reply) == ids  # the other user's C has its own position

    run(scenario())


def test_live_polling_keeps_no_state(tmp_path) -> None:
    async def scenario() -> None:
        config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)
        async with serving(config) as server:
            ids = await add_events(server.url, 4)
            assert _ids(await poll(server.url, "LIVE")) == ids  # the newest, in id order
            assert _ids(await poll(server.url, "LIVE", ids[1])) == ids[2:]
            assert _ids(await poll(server.url, "LIVE", ids[1])) == ids[2:]  # nothing kept

    run(scenario())


def test_generation_needs_a_secure_channel_and_a_type_it_can_store(tmp_path) -> None:
    async def scenario() -> None:
        plain = stream_server_config(f"sqlite:///{tmp_path}/a.db")
        async with serving(plain) as server:
            add = {"type": "ORDER", "data": 1}
            reply = await call(server.url, "futoin.evt.gen:1.1:addEvent", add)
            assert reply["e"] == "SecurityError" and "Insecure channel" in reply["edesc"]
            async with httpx.AsyncClient() as client:
                message = {"f": "futoin.evt.gen:1.1:addEvent", "p": add, "sec": SEC}
                response = await client.post(
                    server.url, content=json.dumps(message), headers={"X-Forwarded-Proto": "https"}
                )
                assert response.json()["e"] == "SecurityError"  # proxy headers not trusted
        proxied = stream_server_config(f"sqlite:///{tmp_path}/b.db", trust_proxy=True)
        async with serving(proxied) as server:
            async with httpx.AsyncClient() as client:
                message = {"f": "futoin.evt.gen:1.1:addEvent", "p": add, "sec": SEC}
                response = await client.post(
                    server.url, content=json.dumps(message), headers={"X-Forwarded-Proto": "https"}
                )
                assert int(response.json()["r"]) > 0
            reply = await call(server.url, "futoin.evt.gen:1.1:addEvent", add)
            assert reply["e"] == "SecurityError"
        secure = stream_server_config(f"sqlite:///{tmp_path}/c.db", secure_channel=True)
        async with serving(secure) as server:
            for event_type, fragment in [("AUDIT", "not one exact"), ("NOPE", "carries only")]:
                reply = await call(
                    server.url, "futoin.evt.gen:1.1:addEvent", {"type": event_type, "data": 1}
                )
                assert reply["e"] == "InvalidRequest" and fragment in reply["edesc"]

    run(scenario())


def test_bad_requests_get_their_error_and_harm_nothing(tmp_path) -> None:
    async def scenario() -> None:
        config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)
        async with serving(config) as server:
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "OK"})
            ids = await add_events(server.url, 2)
            async with httpx.AsyncClient() as client:
                for body, name in [
                    (b"{not json", "InvalidRequest"),
                    (b"[]", "InvalidRequest"),
                    (
                        json.dumps(
                            {"f": "futoin.evt.poll:1.1:pollEvents", "p": {"component": "OK"}}
                        ),
                        "SecurityError",
                    ),
                    (
                        json.dumps(
                            {
                                "f": "futoin.evt.poll:1.1:pollEvents",
                                "p": {"component": "OK"},
                                "sec": "ftn18:nope",
                            }
                        ),
                        "SecurityError",
                    ),
                    (
                        json.dumps(
                            {
                                "f": "futoin.evt.push:1.1:readyToReceive",
                                "p": {"component": "OK"},
                                "sec": SEC,
                            }
                        ),
                        "InvalidRequest",
                    ),
                    (
                        json.dumps(
                            {
                                "f": "futoin.evt.poll:1.1:pollEvents",
                                "p": {"component": "NEVER"},
                                "sec": SEC,
                            }
                        ),
                        "NotRegistered",
                    ),
                    (
                        json.dumps(
                            {
                                "f": "futoin.evt.poll:1.1:registerConsumer",
                                "p": {"component": "LIVE"},
                                "sec": SEC,
                            }
                        ),
                        "LiveNotAllowed",
                    ),
                    (
                        json.dumps({"f": "futoin.evt.push:3.0:pollEvents", "p": {}, "sec": SEC}),
                        "NotSupportedVersion",
                    ),
                    (
                        json.dumps({"f": "futoin.evt.other:1.0:x", "p": {}, "sec": SEC}),
                        "UnknownInterface",
                    ),
                    (b"x" * (70 * 1024), "InvalidRequest"),
                ]:
                    response = await client.post(server.url, content=body)
                    assert response.status_code == 200
                    assert response.headers["content-type"] == "application/futoin+json"
                    assert response.json()["e"] == name, (body[:80], response.json())
            assert _ids(await poll(server.url, "OK")) == ids  # nothing was lost or moved
            ping = await call(server.url, "futoin.ping:1.0:ping", {"echo": 7}, sec=None)
            assert ping == {"r": {"echo": 7}}  # futoin.ping needs no user

    run(scenario())


def test_a_flood_of_wrong_passwords_does_not_hold_up_known_callers(tmp_path) -> None:
    """Each wrong password costs a full scrypt check (tens of ms at the default cost); they
    queue in a thread of their own, so a caller already verified is answered meanwhile."""
    from tidings.config.passwords import hash_password

    config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)
    config["stream_users"]["slow"] = {"password_hash": hash_password("right")}  # default cost

    async def scenario() -> None:
        async with serving(config) as server:
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "OK"})
            finished: list[str] = []

            async def wrong(index: int) -> None:
                reply = await call(
                    server.url,
                    "futoin.evt.poll:1.1:pollEvents",
                    {"component": "OK"},
                    sec=f"slow:wrong{index}",
                )
                assert reply["e"] == "SecurityError"
                finished.append("wrong")

            flood = [asyncio.create_task(wrong(i)) for i in range(30)]
            await asyncio.sleep(0.05)
            reply = await poll(server.url, "OK")
            finished.append("known")
            assert "r" in reply
            await asyncio.gather(*flood)
            assert finished.index("known") < len(finished) - 1  # answered inside the flood

    run(scenario(), timeout=60)


def test_a_caller_gone_before_its_request_ended_is_no_error(tmp_path, caplog) -> None:
    """A poller that dies in the middle of sending its request (SIGKILLed, as in the chain's
    guarantee test) is nobody to answer: no traceback in the log, and the others are served."""

    async def scenario() -> None:
        config = stream_server_config(f"sqlite:///{tmp_path}/e.db", secure_channel=True)
        async with serving(config) as server:
            await call(server.url, "futoin.evt.poll:1.1:registerConsumer", {"component": "OK"})
            ids = await add_events(server.url, 2)
            port = int(server.url.rsplit(":", 1)[1].split("/")[0])
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /evt HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n"
                b'{"f": "futoin.evt.poll:1.1:pollEvents", '
            )
            await writer.drain()
            await asyncio.sleep(0.2)  # the server is reading the body
            writer.transport.abort()  # gone, as a killed process's socket
            await asyncio.sleep(0.2)
            assert _ids(await poll(server.url, "OK")) == ids

    with caplog.at_level(logging.INFO):
        run(scenario())
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
