"""The :class:`EventStore`: the event log's operations, each one transaction.

It checks its inputs, then runs each operation in one transaction of :mod:`.driver`:
registrations plan what to store and number it with :mod:`.planning`, reads select from the
tables of :mod:`.schema` and decode the rows there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

from sqlalchemy import Connection, delete, func, or_, select

from tidings.errors import StoreError
from tidings.events.model import EventId, EventType, NewEvent, StoredEvent
from tidings.events.sources import Source
from tidings.events.validation import require_int, require_outbox_id
from tidings.server.store.appending import Appending
from tidings.server.store.copies import forget_copies, record_copies
from tidings.server.store.counters import (
    HeldCounters,
    continue_after,
    last_event_id,
    raise_id_counters,
    raise_server_marks,
    seed_counters,
)
from tidings.server.store.driver import (
    Checkpointer,
    DriverCursor,
    Writer,
    parse_url,
    store_engine,
    transaction,
)
from tidings.server.store.planning import (
    Registered,
    add_types,
    encode_synced_types,
    encode_types,
    insert_synced,
    plan_synced,
    select_by_outbox_ids,
)
from tidings.server.store.schema import events_from_rows, events_table, prepare_schema
from tidings.server.store.sources import forget_sources, sources_of

log = logging.getLogger(__name__)

#: Positions per DELETE statement.
_DELETE_CHUNK = 500


class EventStore:
    """The durable event log of one event server (``server_id``), safe to share by threads.

    Several stores, threads or processes may append to one database at once; appends are
    serialized by the database, reads run concurrently with them.
    """

    def __init__(self, url: str, server_id: int = 1) -> None:
        require_int("event store: server_id", server_id, minimum=1)
        self.server_id = server_id
        #: Types known to be in event_types (rows there are never deleted), so that a
        #: register of known types writes nothing there.
        self._known_types: set[str] = set()
        parsed = parse_url(url)
        self.url = parsed.render_as_string(hide_password=True)
        self._engine = store_engine(parsed)
        self._writer = Writer(self._engine)
        #: The held transaction's counters, kept in memory (``durability: periodic``).
        self._held: HeldCounters | None = None
        self._closed = False
        try:
            self._prepare()
        except BaseException:
            self._engine.dispose()
            raise
        self._checkpointer = Checkpointer(self._engine) if self.backend == "sqlite" else None

    @property
    def backend(self) -> str:
        """The database kind: ``sqlite`` or ``postgresql``."""
        return self._engine.dialect.name

    def register(self, events: Sequence[NewEvent]) -> list[StoredEvent]:
        """Store ``events`` as one session, all or nothing; return one stored event per input.

        An event whose ``(outbox_event_id, type)`` is already stored (or repeated earlier in
        the same call) is not stored again: its slot holds the event stored first. The same
        outbox id with another type is a different event. A call made only of such duplicates
        uses no session or instance number.
        """
        return self.register_sessions([events])[0].events

    def register_sessions(
        self,
        sessions: Sequence[Sequence[NewEvent]],
        *,
        validated: bool = False,
        wait: bool = True,
        sources: Sequence[Sequence[Source]] | None = None,
    ) -> list[Registered]:
        """Store several sessions in one transaction (group commit), in order, all or nothing.

        Each session gets its own session number and timestamp exactly as if it had been
        registered alone (:meth:`register`); only the commit is shared, which is what makes
        many small registrations fast. Outbox duplicates are recognised across the sessions
        of the call too. ``validated`` says the caller (the engine) has already checked every
        event with :func:`validate_new_event`, so the store does not check them again. With
        ``wait`` off, a call that would have to wait for another writer raises
        :class:`StoreBusy` instead, having stored nothing. ``sources``, one per event of each
        session, is recorded in ``event_sources`` (see :meth:`sources_of`).
        """
        encoded_types: dict[EventType, str] = {}
        for events in sessions:
            encoded_types.update(encode_types(events, check=not validated))
        if not encoded_types:
            return [Registered([], []) for _ in sessions]
        with self.appending(wait=wait) as appending:
            return appending.register_encoded(sessions, encoded_types, sources)

    @contextmanager
    def appending(self, *, wait: bool = True) -> Iterator[Appending]:
        """One append transaction, committed when the block ends (rolled back if it raises),
        for a writer that decides what to store from what is stored (the engine, which
        offers modules only the outbox events not stored yet); see :mod:`.appending`.

        It holds the append lock throughout: keep it short. ``wait`` as for
        :meth:`register_sessions`.
        """
        if self._closed:
            raise StoreError(f"event store {self.url}: cannot register: the store is closed")
        with self._writer.transaction(self.url, wait) as conn:
            appending = Appending(conn, self.server_id, self._held, self._known_types)
            yield appending
        self._known_types |= appending.new_types

    def append_synced(self, events: Sequence[StoredEvent]) -> list[StoredEvent]:
        """Store events received from peer servers with their own ids and timestamps.

        Ids, timestamps, source timestamps, payloads and outbox ids are kept as given; the
        ``position`` of the inputs is ignored and fresh local positions are assigned in input
        order. All or nothing, under the same append lock as :meth:`register`. Returns the
        newly stored events, in input order, with their positions.

        An id already stored (or repeated earlier in the call) is skipped silently, so a
        syncer may re-send what it is not sure arrived. Events of this store's own server
        (a restored peer sending our events back) are stored too, and the session and
        instance counters of their server are moved past them so that :meth:`register` never
        reuses their ids.

        An event whose ``(outbox_event_id, type)`` is already stored under another id is
        skipped with a warning instead of failing the call: that is how an outbox event is stored
        once across a group of servers. It reaches several of them, from the relay (which
        resends to another server when one fails before answering) and from their peers'
        Syncers (which carry the outbox id between tidings servers); each store keeps the
        first copy it gets, and records the skipped copy's id as another name of it
        (:mod:`.copies`). The database holds one row per key, and refusing the batch would
        stop the sync for good. For the same reason PostgreSQL skips, with an error, an
        event too long for its indexes (see :func:`~tidings.events.validation.size_problem`).
        """
        encoded_types = encode_synced_types(events)
        if not events:
            return []
        with self._transaction("append synced events", append=True) as conn:
            raw = DriverCursor.of(conn)
            raise_server_marks(raw, events)
            plan = plan_synced(conn, raw, events, encoded_types)
            stored = insert_synced(raw, plan.fresh, encoded_types) if plan.fresh else []
            if stored:
                add_types(raw, {encoded_types[e.type] for e in stored})
                raise_id_counters(conn, stored)
            held = plan.held | {e.id: e.position for e in stored}
            record_copies(raw, [(copy, held[owner]) for copy, owner in plan.copies])
        return stored

    def continue_after(self, last_ids: Sequence[EventId]) -> None:
        """Number every later session and instance of the servers of ``last_ids`` after
        those ids, and let their Syncers resume after them (see
        :func:`~.counters.continue_after`), whether or not their events are stored."""
        for last in last_ids:
            if not isinstance(last, EventId):
                raise StoreError(f"continue_after: not an EventId: {last!r}")
            require_int("continue_after: server", last.server, minimum=1)
            require_int("continue_after: session", last.session, minimum=0)
            require_int("continue_after: instance", last.instance, minimum=0)
        with self._transaction("continue the id counters", append=True) as conn:
            continue_after(DriverCursor.of(conn), last_ids)

    def read(self, after_position: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Return up to ``limit`` events with a position greater than ``after_position``."""
        require_int("after_position", after_position, minimum=0)
        require_int("limit", limit, minimum=1)
        query = (
            select(events_table)
            .where(events_table.c.position > after_position)
            .order_by(events_table.c.position)
            .limit(limit)
        )
        with self._transaction("read") as conn:
            return events_from_rows(conn.execute(query))

    def events_after(self, last: EventId, limit: int = 1000) -> list[StoredEvent]:
        """Return up to ``limit`` events of server ``last.server`` with an id after ``last``.

        What a Hat syncer server sends a client that reports ``last`` as its last event id:
        ordered by ``(session, instance)``, ids compared as tuples, other servers' events
        excluded. ``EventId(server, 0, 0)`` asks from the start. Served by the unique index
        on the event id.
        """
        if not isinstance(last, EventId):
            raise StoreError(f"events_after: last must be an EventId, not {last!r}")
        require_int("events_after: last.server", last.server, minimum=1)
        require_int("events_after: last.session", last.session, minimum=0)
        require_int("events_after: last.instance", last.instance, minimum=0)
        require_int("events_after: limit", limit, minimum=1)
        c = events_table.c
        query = (
            select(events_table)
            .where(
                c.server == last.server,
                # The first condition bounds the index range; the second drops the rows of
                # session last.session up to last.instance.
                c.session >= last.session,
                or_(c.session > last.session, c.instance > last.instance),
            )
            .order_by(c.session, c.instance)
            .limit(limit)
        )
        with self._transaction("read events after an event id") as conn:
            return events_from_rows(conn.execute(query))

    def by_outbox_ids(self, ids: Iterable[str]) -> dict[str, list[StoredEvent]]:
        """Return the stored events of ``ids`` by outbox event id; unknown ids are absent.

        One outbox id may have been stored under several types; its list holds all of them,
        in position order.
        """
        if isinstance(ids, str):
            raise StoreError("by_outbox_ids takes an iterable of ids, not one str")
        wanted = set(ids)
        for outbox_id in wanted:
            require_outbox_id(outbox_id)
        with self._transaction("look up outbox ids") as conn:
            found: dict[str, list[StoredEvent]] = {}
            for event in select_by_outbox_ids(DriverCursor.of(conn), wanted):
                assert event.outbox_event_id is not None
                found.setdefault(event.outbox_event_id, []).append(event)
            return found

    def sources_of(self, ids: Iterable[EventId]) -> dict[EventId, Source]:
        """Who registered each of the events ``ids`` (see :mod:`.sources`); an event without
        a recorded source (stored before tidings recorded them, or synced from a peer) is
        left out."""
        with self.snapshot("read sources") as conn:
            return sources_of(conn, ids)

    def last_position(self) -> int:
        """The position of the newest stored event (0 when the store is empty)."""
        with self._transaction("read the last position") as conn:
            last: int = conn.execute(
                select(func.coalesce(func.max(events_table.c.position), 0))
            ).scalar_one()
        return last

    def count(self) -> int:
        """Return the number of stored events."""
        with self._transaction("count") as conn:
            return conn.execute(select(func.count()).select_from(events_table)).scalar_one()

    def last_event_id(self, server_id: int | None = None) -> EventId:
        """Return the greatest id of ``server_id`` (default: this store's server) stored or
        received from its Syncer, even if retention has deleted it since: the Syncer resumes
        after it (see :func:`~.counters.raise_server_marks`).

        ``EventId(server, 0, 0)`` means no event of that server was stored, as in Hat.
        """
        server = self.server_id if server_id is None else server_id
        require_int("server_id", server, minimum=1)
        with self._transaction("read last event id") as conn:
            return last_event_id(conn, server)

    @contextmanager
    def snapshot(self, action: str = "read") -> Iterator[Connection]:
        """A transaction for reading whose statements all see the same state of the store.

        For readers that need several statements (tidings.server.store.queries resolves type
        patterns, then reads events): on PostgreSQL it is ``REPEATABLE READ READ ONLY``, as
        ``READ COMMITTED`` would let each statement see newer events; SQLite's transaction
        already reads one snapshot (nothing stops a write there: do not write). Select
        :data:`EVENT_COLUMNS` and decode the rows with :func:`events_from_rows`. ``action``
        names the work in errors, which leave as :class:`StoreError`.
        """
        with self._transaction(action, snapshot=True) as conn:
            yield conn

    def delete_positions(self, positions: Sequence[int]) -> int:
        """Delete the events at ``positions`` (:mod:`.retention` decides which), the
        records of their peers' copies (:mod:`.copies`) and the sources of the sessions left
        empty (:mod:`.sources`); how many events there were.
        Positions are never reused: the counters keep growing past deleted events."""
        deleted = 0
        c = events_table.c
        with self._transaction("delete events", append=True) as conn:
            for start in range(0, len(positions), _DELETE_CHUNK):
                chunk = list(positions[start : start + _DELETE_CHUNK])
                forget_sources(conn, chunk)
                deleted += conn.execute(delete(events_table).where(c.position.in_(chunk))).rowcount
                forget_copies(conn, chunk)
        return deleted

    @contextmanager
    def transaction(self, action: str) -> Iterator[Connection]:
        """A read-write transaction on the store's database, for the tables that parts
        above the server keep beside the log (the streams' consumer positions). On SQLite it
        holds the write lock from its start (waiting for it), so reading before writing in it
        is safe; it does not take the append lock: do not write the log's tables in it.
        Errors leave as :class:`StoreError` naming ``action``.
        """
        with self._transaction(action, write=True) as conn:
            yield conn

    def hold_writes(
        self,
        on_opened: Callable[[], None] = lambda: None,
        on_committed: Callable[[int | None], None] = lambda _: None,
    ) -> None:
        """Keep registrations in an open transaction until :meth:`flush` (the server's
        ``durability: periodic``); see :class:`~.driver.Writer`.

        ``on_opened`` is called when such a transaction begins and ``on_committed`` with
        the last position it stored when it is committed, by whichever thread writes or
        commits (a module's own sessions, a stream consumer's acknowledgement, retention
        commit the held writes before their own), with the store's writer lock held: they
        must only hand the news on."""
        # A type written in a transaction that is rolled back is not stored after all.
        self._held = self._writer.held = HeldCounters(
            self._known_types.clear, on_opened, on_committed
        )

    @property
    def unflushed(self) -> bool:
        """Held registrations wait for :meth:`flush`."""
        return self._writer.unflushed

    @property
    def failed(self) -> str | None:
        """Why held registrations were lost, if they were (the store takes no more writes)."""
        return self._writer.failed

    def flush(self) -> None:
        """Commit the held registrations, if any."""
        self._writer.flush(self.url)

    def close(self) -> None:
        """Commit held registrations and close all database connections; the store is not
        used afterwards."""
        try:
            self.flush()
        except StoreError as exc:
            log.error("event store %s: held registrations lost at close: %s", self.url, exc)
        self._closed = True
        if self._checkpointer is not None:
            self._checkpointer.close()
        self._writer.close()
        self._engine.dispose()

    def _prepare(self) -> None:
        """Create or upgrade the schema and seed this server's counters.

        Done under the append lock so that stores opening one new database at once do not
        race each other's ``CREATE TABLE`` or upgrade.
        """
        with self._transaction("create schema", append=True, schema=True) as conn:
            prepare_schema(conn, self.url)
            seed_counters(conn, self.server_id)

    @contextmanager
    def _transaction(
        self,
        action: str,
        *,
        append: bool = False,
        snapshot: bool = False,
        write: bool = False,
        schema: bool = False,
    ) -> Iterator[Connection]:
        """One transaction of :func:`.driver.transaction`, refused once the store is closed.

        A writing one commits the held registrations first: on SQLite it would otherwise wait
        for the write lock they hold until the next flush (and forever in the thread that
        flushes them)."""
        if self._closed:
            raise StoreError(f"event store {self.url}: cannot {action}: the store is closed")
        if (append or write) and self._writer.unflushed:
            self.flush()
        with transaction(
            self._engine,
            self.url,
            action,
            append=append,
            snapshot=snapshot,
            write=write,
            schema=schema,
        ) as conn:
            yield conn
