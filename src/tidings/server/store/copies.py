"""The peers' copies of events this store holds under another id (``event_synced_copies``).

One outbox event can be stored by two servers of a group under two ids: the relay sent it to
one, lost that server before its answer, and sent it again to the other, which stored its
own copy before the Syncer brought the first one's. Each store keeps the copy it got first
and skips the other when the Syncer brings it (same outbox id and type,
:meth:`~tidings.server.store.facade.EventStore.append_synced`). Skipping loses nothing of
the log, but the skipped id was this event's name on the other server: a stream consumer
that read it there, and whose position travels between servers as event ids, must find it
here as read. So the store records each skipped copy's id against the position of the event
it holds (:func:`record_copies`), and a reader turning ids into positions asks which other
ids name the events of a run of positions (:func:`copies_between`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import Connection, delete, select

from tidings.events.model import EventId
from tidings.server.store.driver import DriverCursor
from tidings.server.store.schema import synced_copies_table


def record_copies(conn: DriverCursor, copies: Iterable[tuple[EventId, int]]) -> None:
    """Record that each ``(copy id, position)`` of ``copies`` names the event at that
    position; a copy recorded before (a Syncer sending it again) is left as it is."""
    rows = sorted({(c.server, c.session, c.instance, position) for c, position in copies})
    if rows:
        conn.executemany(
            f"INSERT INTO {synced_copies_table.name} (server, session, instance, position) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (server, session, instance) DO NOTHING",
            rows,
        )


def copies_between(conn: Connection, after: int, upto: int) -> dict[int, list[EventId]]:
    """The copies' ids of the events at positions ``(after, upto]``, by position (most
    events have none)."""
    c = synced_copies_table.c
    rows = conn.execute(
        select(c.position, c.server, c.session, c.instance).where(
            c.position > after, c.position <= upto
        )
    ).all()
    found: dict[int, list[EventId]] = {}
    for position, server, session, instance in rows:
        found.setdefault(int(position), []).append(EventId(server, session, instance))
    return found


def forget_copies(conn: Connection, positions: Sequence[int]) -> None:
    """Forget the copies of the events at ``positions`` (they are being deleted)."""
    conn.execute(delete(synced_copies_table).where(synced_copies_table.c.position.in_(positions)))
