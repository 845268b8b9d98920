"""The embedded event store: a durable, append-only event log in SQLite or PostgreSQL.

It is the storage of a Hat-compatible event server, so it keeps Hat's event model
(:mod:`tidings.events`, checked by :mod:`tidings.events.validation`): an event id is
``(server, session, instance)`` with 0 reserved for "before the first"; one register call is
one session whose events share the server timestamp; the type is a list of strings. On top
of that every event gets a ``position``, an increasing 64-bit integer over the whole log,
which stream consumers (FTN18) keep as their cursor, and the outbox event id it came from,
by which (with its type) a re-published event is recognised and not stored twice.

Events of other servers, received by a Hat syncer, are stored with their own ids and
timestamps (:meth:`EventStore.append_synced`); :meth:`EventStore.events_after` serves a
syncer's backlog. A table of the distinct event types lets queries resolve type patterns to
exact types. The same SQLAlchemy Core code runs on both databases, and every statement on
the store's tables lives in this package.

One module per concern, bottom up: :mod:`.driver` (engine, transactions, the append lock,
the plain-SQL cursor, the WAL checkpoint thread), :mod:`.schema` (tables, creation,
upgrades, the row format), :mod:`.counters` (positions, session and instance numbers),
:mod:`.copies` (the peers' copies of held events, by their ids), :mod:`.planning` (what an
append stores: dedup, then the rows), :mod:`.appending` (one append transaction for a
writer that reads what is stored first), :mod:`.facade` (the :class:`EventStore`); then the
reads and deletes on top of it: :mod:`.type_patterns` (Hat type patterns as conditions on
the stored type), :mod:`.queries` (Hat queries from the indexes), :mod:`.positions` (reads
in position order, for stream consumers) and :mod:`.retention` (discarding what every
reader is done with). The names below are the store's surface for the rest of the server
and its users; what only the store's own modules use (the planner's ``Registered``, which
:meth:`EventStore.register_sessions` returns) stays in its module.
"""

from tidings.server.store.driver import DriverCursor
from tidings.server.store.facade import EventStore
from tidings.server.store.schema import EVENT_COLUMNS, events_from_rows, events_table

__all__ = [
    "EVENT_COLUMNS",
    "DriverCursor",
    "EventStore",
    "events_from_rows",
    "events_table",
]
