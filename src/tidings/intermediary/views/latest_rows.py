"""A table's initial state: the newest row event of every key.

(Placeholder while the server side is written: the whole history, oldest first.)
"""

from __future__ import annotations

from tidings.client import Client, QueryData, QueryType, StoredEvent


async def latest_rows(client: Client, row_type: QueryType) -> list[StoredEvent]:
    """The row events a table of ``row_type`` loads from, oldest first."""
    return await client.query(QueryData(event_types=(row_type,), order="ascending"))
