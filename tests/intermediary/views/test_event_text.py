"""An event going to many subscriptions is written to JSON once and the key of each added
to that text (:func:`~tidings.intermediary.views.messages.keyed`), found by the hostile
benchmark: writing it once per subscriber on the serving loop stalled every other
subscriber. What is asserted is what the subscribers get (the cost is not: no test asserts
timings): each its own key and the event unchanged, keys that need escaping included. A
real event server, chain, intermediary and subscriber clients, as in
test_event_server_upstream."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.chain_helpers import chain_rig
from tests.support.server_helpers import running
from tidings.client import connect, json_event
from tidings.intermediary.views.messages import keyed

pytestmark = pytest.mark.sockets

WAIT = 60.0
#: Keys as subscribers may choose them: shared, quoted, not ASCII, JSON-looking.
KEYS = ["busy", "busy", 'a "quoted" key', "clé ünïcode ✓", '{"key": 1}']


@pytest.mark.parametrize("key", KEYS)
def test_the_text_is_the_message_with_its_key(key: str) -> None:
    message = {"op": "event", "id": [1, 2, 3], "type": ["a", "b"], "payload": {"x": [1, "y"]}}
    assert json.loads(keyed(json.dumps(message), key)) == {**message, "key": key}


def test_every_subscription_of_an_event_gets_it_with_its_own_key(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv, chain_rig(srv.address) as rig:
            clients = [await rig.client() for _ in KEYS]
            try:
                for client, key in zip(clients, KEYS, strict=True):
                    await client.subscribe_events(key, [["app", "busy", "*"]])
                payload: dict[str, Any] = {"n": 1, "text": 'quote " and ✓', "list": [1, None]}
                async with await connect(srv.address) as producer:
                    [event] = await producer.register_with_response(
                        [json_event(("app", "busy", "1"), payload)]
                    )
                assert event is not None
                for client, key in zip(clients, KEYS, strict=True):
                    got = await client.message(WAIT)
                    assert got["key"] == key
                    assert got["op"] == "event"
                    assert tuple(got["id"]) == (
                        event.id.server,
                        event.id.session,
                        event.id.instance,
                    )
                    assert got["type"] == ["app", "busy", "1"]
                    assert got["payload"] == payload
            finally:
                for client in clients:
                    await client.close()

    asyncio.run(asyncio.wait_for(main(), WAIT))
