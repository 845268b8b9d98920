"""Query replies larger than a client takes in one frame. The server answers a query whole,
in one ``MsgQueryRes``, as hat-event 0.8.5 does (its protocol has no paging): the real
hat-event 0.8.5 client reads it; tidings' client, over its ``max_frame_bytes``, gets
:class:`ReplyTooLarge` naming the limit and keeps its connection, and reads the same events
with :meth:`Client.query_pages`, a hat-event 0.8.5 query per page."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import hat.event.common as hat
import hat.event.eventer as hat_eventer
import pytest

from tests.support.server_helpers import running
from tests.support.waiting import run
from tidings.client import (
    Client,
    ClientError,
    EventId,
    NewEvent,
    PayloadKind,
    QueryData,
    ReplyTooLarge,
    connect,
)
from tidings.events.query import Order

pytestmark = pytest.mark.sockets

#: Sessions of 40 events of ~150 bytes on the wire: ~36 KB in all.
SESSIONS = 6
SESSION_EVENTS = 40
LIMIT = 16 * 1024


async def _fill(client: Client) -> None:
    """Sessions whose events share their timestamp (as every session's do), with another
    type between them."""
    for _ in range(SESSIONS):
        events = [
            NewEvent(("big", str(n % 3)), b"p" * 100, PayloadKind.BINARY)
            for n in range(SESSION_EVENTS)
        ]
        await client.register_with_response(events)
        await client.register_with_response([NewEvent(("other",))])


def _ids(events: Sequence[object]) -> list[EventId]:
    return [e.id for e in events]  # type: ignore[attr-defined]


async def _paged(client: Client, query: QueryData, page_events: int) -> list[EventId]:
    pages = [page async for page in client.query_pages(query, page_events)]
    assert all(0 < len(page) <= page_events for page in pages)
    return [event.id for page in pages for event in page]


def test_a_reply_over_the_client_limit_is_whole_for_hat_and_refused_by_ours(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv:
            async with await connect(srv.address) as writer:
                await _fill(writer)
            hat_client = await hat_eventer.connect(srv.address)
            try:
                whole = await hat_client.query(
                    hat.QueryData(event_types=[("big", "*")], order=hat.Order.ASCENDING)
                )
            finally:
                await hat_client.async_close()
            assert len(whole) == SESSIONS * SESSION_EVENTS
            async with await connect(srv.address, max_frame_bytes=LIMIT) as client:
                query = QueryData(event_types=(("big", "*"),), order="ascending")
                with pytest.raises(ReplyTooLarge, match=rf"max_frame_bytes \({LIMIT} bytes\)"):
                    await client.query(query)
                assert client.is_open
                paged = await _paged(client, query, page_events=50)
            hat_ids = [
                EventId(e.event_id.server, e.event_id.session, e.event_id.instance) for e in whole
            ]
            assert paged == hat_ids

    run(main())


@pytest.mark.parametrize("order", ["ascending", "descending"])
def test_pages_give_one_querys_events_once_in_its_order(tmp_path: Path, order: Order) -> None:
    """Pages smaller than a session, about one, larger than all; with the query's own time
    bound and ``max_results`` kept."""

    async def main() -> None:
        async with running(tmp_path) as srv, await connect(srv.address) as client:
            await _fill(client)
            query = QueryData(event_types=(("big", "*"),), order=order)
            whole = _ids(await client.query(query))
            for page_events in (7, SESSION_EVENTS, 1000):
                assert await _paged(client, query, page_events) == whole
            some = await client.query(QueryData(event_types=(("big", "*"),), max_results=100))
            middle = some[SESSION_EVENTS + 5].timestamp_us  # the bound inside a session
            if order == "ascending":
                bounded = QueryData(event_types=(("big", "*"),), order=order, t_from=middle)
            else:
                bounded = QueryData(event_types=(("big", "*"),), order=order, t_to=middle)
            capped = QueryData(event_types=(("big", "*"),), order=order, max_results=55)
            for selected in (bounded, capped):
                assert await _paged(client, selected, 7) == _ids(await client.query(selected))

    run(main())


def test_query_pages_refuses_what_it_cannot_page(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as srv, await connect(srv.address) as client:
            for query, page_events, reason in (
                (QueryData(order_by="source_timestamp"), 10, "by timestamp"),
                (QueryData(unique_type=True), 10, "without unique_type"),
                (QueryData(), 0, "page_events must be a positive int"),
            ):
                with pytest.raises(ClientError, match=reason):
                    await anext(client.query_pages(query, page_events))
            assert client.is_open

    run(main())
