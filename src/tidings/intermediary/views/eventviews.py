"""Event-type and SQL-view subscriptions, fed by the event server.

:class:`EventViews` is the transport-free part, single-writer like
:class:`~tidings.intermediary.node.intermediary.Intermediary`: the caller (the WebSocket server, or
a test) hands it subscribe and unsubscribe requests and calls :meth:`EventViews.step` once per tick,
which takes the upstream batches that arrived, makes them one epoch and returns the messages to
send, as ``(subscriber, message)`` pairs in the order to send them.

Its stores, as claim 1 says: the publisher store is the two dictionaries of subscriptions
(subscriber and key -> patterns, or -> view); the subscriber store is :attr:`patterns` (the
upstream pattern set, kept minimal and at most :data:`.patterns.MAX_UPSTREAM` patterns by
:func:`.patterns.widen`) and :attr:`tables` (the
tables whose row events it folds). A new event subscription is *covered* when the upstream
patterns together already match every type it matches (:func:`.patterns.covered`); a new
view is covered when the tables it reads are already held (:func:`.primitives.covers`: a
table's upstream is all of its row events, so its primitive asks for every row and column).
Whatever is not covered is asked for by replacing the event server's subscription with the
new set (the Hat subscription is a set, replaced whole); an unsubscribe shrinks it the same
way, and a table no view reads any more is dropped.

The state store for views is double-buffered: row events are folded into an inert
:class:`~tidings.intermediary.views.sqltables.TableState` as they arrive, and at the epoch's end the
active one, which views are evaluated on, :meth:`~.TableState.adopt`\\ s it whole.

Events are a stream, not a latest value: each subscriber's matching events are sent, in the
server's order, one JSON message each, from the first epoch after its subscription on; none is
skipped or merged. A slow event subscriber is bounded by the transport's per-connection queue
(overflow closes the connection with a reason), never by dropping events. A view is a latest
value: it is scheduled (:class:`.scheduling.Scheduler`, ``per_epoch``) at its rate and
priority, and each time it is due it gets its rows, or ``unchanged`` when its tables did not
change or the result is what it last got.

Views are evaluated in one worker thread, each on the active tables of the epoch it was due
in (a copy made by :meth:`~.TableState.adopt`: Arrow tables are shared, not copied), and its
message goes out with the first :meth:`EventViews.step` after it finished, carrying that
epoch. So a view that runs to its bounds (:class:`~.sqlviews.SqlLimits`) delays other views
at most, never the event loop that serves frames, events and requests. A subscriber has
one evaluation in the worker at a time (its other due views wait their turn), so a subscriber
whose views run to their bounds delays another's view by one evaluation at most per such
subscriber.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import threading
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

from tidings.errors import IntermediaryError, UsageError
from tidings.events import QueryType, StoredEvent, TypeMatcher
from tidings.intermediary.node.intermediary import MAX_KEY_BYTES, check_schedule
from tidings.intermediary.node.publisher_store import DEFAULT_MAX_PER_SUBSCRIBER
from tidings.intermediary.node.scheduling import Scheduler
from tidings.intermediary.views.grants import Grant
from tidings.intermediary.views.messages import (
    ChainUpstream,
    EventText,
    Outgoing,
    event_message,
)
from tidings.intermediary.views.patterns import covers_all, parse_patterns, widen
from tidings.intermediary.views.primitives import Primitive, covers
from tidings.intermediary.views.rows import parse_row_change, row_server_type
from tidings.intermediary.views.sqltables import TableState
from tidings.intermediary.views.sqlviews import Catalog, SqlLimits, SqlView

log = logging.getLogger(__name__)

#: The most event types whose matching subscriptions are remembered.
MAX_ROUTES = 10_000
#: Threads evaluating SQL views, by default and at most.
DEFAULT_WORKERS, MAX_WORKERS = 2, 64
#: A subscription: (subscriber, key).
Sid = tuple[Hashable, str]


@dataclass
class _EventSub:
    patterns: tuple[QueryType, ...]
    matcher: TypeMatcher


@dataclass(frozen=True)
class _Result:
    """A view's result as the worker hands it over: JSON-ready, with its digest."""

    columns: list[str]
    rows: list[list[Any]]
    digest: bytes


@dataclass
class _ViewSub:
    view: SqlView
    #: The epoch of the latest evaluation (the one under way, if any).
    evaluated: int = -1
    digest: bytes | None = None
    running: Future[_Result] | None = None
    #: Scheduled: its tables are loaded and its subscribe answered (until then it is only
    #: counted in what upstream must deliver).
    scheduled: bool = False
    #: Its priority as asked (the scheduler's copy may age).
    priority: float = 0.0


class EventViews:
    """Event-type and SQL-view subscriptions over one upstream chain."""

    def __init__(
        self,
        upstream: ChainUpstream,
        catalog: Catalog | None = None,
        *,
        row_type_prefix: Sequence[str] = (),
        limits: SqlLimits | None = None,
        scheduler: Scheduler | None = None,
        max_per_subscriber: int = DEFAULT_MAX_PER_SUBSCRIBER,
        workers: int = DEFAULT_WORKERS,
    ) -> None:
        if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
            raise UsageError(f"workers: expected 1 to {MAX_WORKERS} view workers, got {workers!r}")
        self.upstream = upstream
        self.max_per_subscriber = max_per_subscriber
        self.catalog = catalog
        self.row_type_prefix = tuple(row_type_prefix)
        self.limits = limits or SqlLimits()
        self.scheduler = scheduler if scheduler is not None else Scheduler(per_epoch=True)
        #: The upstream pattern set and the tables folded, as upstream has them now.
        self.patterns: tuple[QueryType, ...] = ()
        self.tables: frozenset[str] = frozenset()
        self._folding: frozenset[str] = frozenset()
        self.active = TableState(catalog)
        self.epoch = 0
        #: Row events that could not be folded (logged; the others go on).
        self.bad_rows = 0
        self._inert = TableState(catalog)
        self._events: dict[Sid, _EventSub] = {}
        #: event type -> subscriber -> its keys the type matches (cleared on any change of the
        #: subscriptions; an event keeps the mapping it was routed with).
        self._routes: dict[tuple[str, ...], dict[Hashable, tuple[str, ...]]] = {}
        self._views: dict[Sid, _ViewSub] = {}
        #: subscriber -> its keys (both kinds), so one subscriber's requests cost O(its own).
        self._keys: dict[Hashable, set[str]] = {}
        self._changed_at: dict[str, int] = {}
        #: Held by the one bringing upstream to the subscriptions (:meth:`_converge`).
        self._sync_lock = asyncio.Lock()
        #: Changes made to the subscriptions, and the last one upstream has taken.
        self._changes = 0
        self._synced = 0
        #: What the sync under way gives upstream (patterns, tables), if one is.
        self._target: tuple[tuple[QueryType, ...], frozenset[str]] | None = None
        self._worker = ThreadPoolExecutor(workers, thread_name_prefix="tidings-sql-views")
        #: Each worker thread's own tables (only that thread touches them).
        self._evaluating = threading.local()
        #: Views whose evaluation was handed to the worker and not yet answered.
        self._running: dict[Sid, _ViewSub] = {}
        #: Views due and not served yet, in order: a subscriber has one evaluation in the
        #: worker at a time, so its other due views (and one due while its own evaluation
        #: runs) wait here instead of being skipped, which would lose an epoch's result.
        self._waiting: dict[Sid, None] = {}

    # -- subscribers -------------------------------------------------------------------

    async def subscribe(
        self,
        subscriber: Hashable,
        key: str,
        *,
        events: object = None,
        sql: object = None,
        priority: object = 0.0,
        rate_hz: object = 10.0,
        grant: Grant | None = None,
    ) -> bool:
        """Subscribe (or replace) ``key`` to event-type ``events`` (a list of patterns) or
        to the view ``sql``; whether it was covered (nothing new asked upstream). With
        ``grant``, what it does not allow is refused, naming the identity (the key's
        previous subscription stays)."""
        if not isinstance(key, str) or not key or len(key.encode()) > MAX_KEY_BYTES:
            raise IntermediaryError(
                f"key: expected a non-empty string of at most {MAX_KEY_BYTES} bytes"
            )
        if (events is None) == (sql is None):
            raise IntermediaryError("subscribe: expected exactly one of events and sql")
        sid = (subscriber, key)
        held_keys = self._keys.get(subscriber, set())
        if key not in held_keys and len(held_keys) >= self.max_per_subscriber:
            raise IntermediaryError(
                f"subscribe: at most {self.max_per_subscriber} event and SQL subscriptions "
                "per subscriber"
            )
        if events is not None:
            patterns = parse_patterns(events)
            if grant is not None:
                grant.check_events(patterns)
            record: _EventSub | _ViewSub = _EventSub(patterns, TypeMatcher(patterns))
            needs: tuple[tuple[QueryType, ...], frozenset[str]] = (patterns, frozenset())
            was_covered = covers_all(self.patterns, patterns)
        else:
            view = self._parse_view(sql)
            if grant is not None:
                grant.check_tables(view.tables)
            prio, rate = check_schedule(priority, rate_hz, self.scheduler.max_priority)
            record = _ViewSub(view, priority=prio)
            needs = ((), frozenset(view.tables))
            held = [self._primitive(t) for t in self.tables]
            was_covered = all(covers(held, p) for p in view.primitives)
        # No lock from here on: what upstream must deliver is the union of the records, so
        # the record goes in first and whichever sync runs next takes it along.
        old_event, old_view = self._events.pop(sid, None), self._views.pop(sid, None)
        self._routes.clear()
        if isinstance(record, _EventSub):
            self._events[sid] = record
        else:
            self._views[sid] = record
        self._keys.setdefault(subscriber, set()).add(key)
        self._changes += 1
        try:
            replaced = old_event is not None or old_view is not None  # may shrink upstream
            if replaced or not (was_covered and self._target_covers(needs)):
                await self._converge()
            await self.upstream.loaded(needs[1])
        except BaseException as exc:  # upstream refused, or the subscriber left: as before
            if self._events.get(sid) is record or self._views.get(sid) is record:
                self._put_back(sid, old_event, old_view)
            elif old_view is not None and old_view.scheduled:  # unsubscribed meanwhile
                self.scheduler.remove(sid)
            if not isinstance(exc, Exception):
                raise
            with contextlib.suppress(IntermediaryError):  # a superset upstream is harmless
                await self._converge()
            raise IntermediaryError(f"upstream: the event server did not take it: {exc}") from exc
        if old_view is not None and old_view.scheduled:
            self.scheduler.remove(sid)
        if isinstance(record, _ViewSub) and self._views.get(sid) is record:
            record.scheduled = True
            self.scheduler.add(sid, prio, rate)
        return was_covered

    async def unsubscribe(self, subscriber: Hashable, key: str | None = None) -> int:
        """Drop one subscription (``key`` None: all of the subscriber's) and shrink upstream
        to what the others need. Returns how many were removed."""
        held = self._keys.get(subscriber, set())
        gone = [(subscriber, k) for k in (set(held) if key is None else held & {key})]
        held.difference_update(k for _, k in gone)
        if not held:
            self._keys.pop(subscriber, None)
        self._routes.clear()
        for sid in gone:
            self._events.pop(sid, None)
            view = self._views.pop(sid, None)
            if view is not None and view.scheduled:
                self.scheduler.remove(sid)
        if gone:
            self._changes += 1
            try:
                await self._converge()
            except IntermediaryError as exc:  # upstream keeps a superset: harmless
                log.warning("intermediary: upstream not shrunk after unsubscribe: %s", exc)
        return len(gone)

    def _put_back(self, sid: Sid, event: _EventSub | None, view: _ViewSub | None) -> None:
        """A subscribe that failed: the key's previous subscription again, or none."""
        self._routes.clear()
        self._events.pop(sid, None)
        self._views.pop(sid, None)
        if event is not None:
            self._events[sid] = event
        elif view is not None:
            self._views[sid] = view
        else:
            keys = self._keys.get(sid[0], set())
            keys.discard(sid[1])
            if not keys:
                self._keys.pop(sid[0], None)
        self._changes += 1

    def counts(self) -> tuple[int, int]:
        """Event and SQL-view subscriptions held, every subscriber's (for metrics)."""
        return len(self._events), len(self._views)

    def subscriptions(self, subscriber: Hashable) -> list[str]:
        """The keys ``subscriber`` holds here."""
        return sorted(self._keys.get(subscriber, ()))

    def described(self, subscriber: Hashable) -> list[dict[str, object]]:
        """``subscriber``'s subscriptions as an operator sees them (its intermediary's
        ``/status``): each key with its kind and the event types or tables it reads; a
        view with its priority and, once scheduled, its rate and frames dropped."""
        found: list[dict[str, object]] = []
        for key in self.subscriptions(subscriber):
            sid = (subscriber, key)
            if (event := self._events.get(sid)) is not None:
                types = ["/".join(pattern) for pattern in event.patterns]
                found.append({"kind": "event", "key": key, "types": types})
            elif (view := self._views.get(sid)) is not None:
                tables = sorted(view.view.tables)
                one = {"kind": "view", "key": key, "tables": tables, "priority": view.priority}
                if view.scheduled:
                    info = self.scheduler.info(sid)
                    one |= {"rate_hz": info.rate_hz, "dropped_frames": info.dropped_total}
                found.append(one)
        return found

    def _parse_view(self, sql: object) -> SqlView:
        if self.catalog is None:
            raise IntermediaryError("sql: this intermediary serves no SQL views (no catalog)")
        if not isinstance(sql, str):
            raise IntermediaryError("sql: expected the text of a SELECT")
        view = SqlView.parse(sql, self.catalog, self.limits)
        for table in view.tables:
            self.catalog.key(table)
        return view

    def _primitive(self, table: str) -> Primitive:
        """What upstream delivers for a held table: every row, every allowed column."""
        assert self.catalog is not None
        return Primitive(table, frozenset(self.catalog.columns(table)))

    def _target_covers(self, needs: tuple[tuple[QueryType, ...], frozenset[str]]) -> bool:
        """Whether the sync under way, if any, keeps ``needs`` (patterns, tables) upstream:
        it may be shrinking upstream for an unsubscribe made before this subscription."""
        if self._target is None:
            return True
        patterns, tables = self._target
        return covers_all(patterns, needs[0]) and needs[1] <= tables

    async def _converge(self) -> None:
        """Return once upstream has taken what the subscriptions need as they are now (or
        as they became later). Changes made while a sync runs share the next one, so a flood
        of subscriptions costs a few round trips to the event server, not one each; the lock
        is held for that round trip only, never while a table loads or a view is evaluated."""
        wanted = self._changes
        async with self._sync_lock:
            if self._synced >= wanted:
                return
            changes = self._changes
            await self._sync()
            self._synced = changes

    async def _sync(self) -> None:
        """Bring upstream to what the subscriptions need, if that is not what it has."""
        tables = frozenset(t for v in self._views.values() for t in v.view.tables)
        types = {t: row_server_type(self.row_type_prefix, t) for t in sorted(tables)}
        wanted = widen({*(p for s in self._events.values() for p in s.patterns),
                        *types.values()})  # fmt: skip
        same = covers_all(self.patterns, wanted) and covers_all(wanted, self.patterns)
        if same and tables == self.tables:
            return
        # Batches (a new table's load among them) may be taken while the update is under
        # way: fold the tables of both the old and the new set meanwhile.
        self._folding = self.tables | tables
        self._target = (wanted, tables)
        try:
            await self.upstream.update(wanted, types)
        finally:
            self._folding = self.tables
            self._target = None
        for table in self.tables - tables:
            self._inert.drop(table)
        self.patterns, self.tables = wanted, tables
        self._folding = tables

    # -- epochs and messages -----------------------------------------------------------

    def step(self, now: float, budget: int) -> list[Outgoing]:
        """Take upstream's batches as one epoch (events to their subscribers, row events
        folded, then the swap), then serve up to ``budget`` due views."""
        out: list[Outgoing] = []
        batches = self.upstream.take()
        for batch in batches:
            for event in batch.events:
                route = self._route_of(event.type)
                if route:
                    out.append(EventText(json.dumps(event_message(event), default=str), route))
            for table, events in batch.rows.items():
                if table in self._folding:
                    self._fold(table, events)
        if batches:
            self.epoch += 1
            for table in self.active.adopt(self._inert):
                self._changed_at[table] = self.epoch
            self.scheduler.state_updated(self.epoch)
        try:
            due = self.scheduler.due(now, budget)
        except UsageError as exc:
            raise IntermediaryError(f"schedule: {exc}") from None
        for sid, record in list(self._running.items()):
            if record.running is not None and record.running.done():
                del self._running[sid]
                if self._views.get(sid) is record:  # not replaced or unsubscribed meanwhile
                    out.append((sid[0], self._finished(sid[1], record)))
        self._waiting.update(dict.fromkeys(cast("list[Sid]", due)))  # views are scheduled by sid
        busy = {subscriber for subscriber, _ in self._running}
        for sid in list(self._waiting):
            waiting = self._views.get(sid)
            if waiting is None or not waiting.scheduled:  # unsubscribed, or replaced
                del self._waiting[sid]
            elif sid[0] not in busy:
                del self._waiting[sid]
                view_message = self._view_message(sid, waiting)
                if view_message is None:
                    busy.add(sid[0])
                else:
                    out.append((sid[0], view_message))
        return out

    def close(self) -> None:
        """Stop the worker (an evaluation under way ends at its bounds)."""
        self._worker.shutdown(wait=False, cancel_futures=True)

    def _route_of(self, event_type: tuple[str, ...]) -> dict[Hashable, tuple[str, ...]]:
        """Who gets an event of ``event_type``: subscriber -> its keys the type matches;
        matched once per type (a server's types are few next to its events), the cache
        bounded by :data:`MAX_ROUTES`."""
        route = self._routes.get(event_type)
        if route is None:
            if len(self._routes) >= MAX_ROUTES:
                self._routes.clear()
            route = {}
            for (subscriber, key), record in self._events.items():
                if record.matcher.matches(event_type):
                    route[subscriber] = (*route.get(subscriber, ()), key)
            self._routes[event_type] = route
        return route

    def _fold(self, table: str, events: Sequence[StoredEvent]) -> None:
        """Row events into the inert tables: per key the last change wins (changes of
        different keys commute), then one delete and one upsert."""
        assert self.catalog is not None
        keys = self.catalog.key(table)
        final: dict[tuple[Any, ...], dict[str, Any] | None] = {}
        for event in events:
            try:
                change = parse_row_change(json.loads(event.payload or b"null"), keys)
            except (IntermediaryError, ValueError) as exc:
                self.bad_rows += 1
                log.warning("intermediary: row event %s of %s skipped: %s", event.id, table, exc)
                continue
            final.pop(change.key, None)
            final[change.key] = change.row
        try:
            deleted = [k for k, row in final.items() if row is None]
            if deleted:
                self._inert.delete(table, deleted)
            rows = [row for row in final.values() if row is not None]
            if rows:
                self._inert.upsert(table, rows, keys)
        except IntermediaryError as exc:
            self.bad_rows += len(final)
            log.warning("intermediary: row events of %s not folded: %s", table, exc)

    def _view_message(self, sid: Sid, record: _ViewSub) -> dict[str, Any] | None:
        """``unchanged`` if its tables did not change since it was evaluated; else None, and
        its evaluation on this epoch's tables is handed to the worker."""
        if record.digest is not None and all(
            self._changed_at.get(t, 0) <= record.evaluated for t in record.view.tables
        ):
            return {"op": "view", "key": sid[1], "epoch": self.epoch, "unchanged": True}
        record.evaluated = self.epoch
        tables = TableState(self.catalog)
        tables.adopt(self.active)
        record.running = self._worker.submit(self._evaluate, record.view, tables)
        self._running[sid] = record
        return None

    def _evaluate(self, view: SqlView, tables: TableState) -> _Result:
        """In a worker: ``view`` on ``tables`` (the worker's SQLite copy rebuilt where they
        changed), as JSON-ready rows and their digest."""
        own: TableState | None = getattr(self._evaluating, "tables", None)
        if own is None:
            own = self._evaluating.tables = TableState(self.catalog)
        own.adopt(tables)
        result = own.evaluate(view)
        columns = result.column_names
        values = [result.column(i).to_pylist() for i in range(result.num_columns)]
        rows = [list(r) for r in zip(*values, strict=True)]
        body = json.dumps([columns, rows], default=str)
        return _Result(columns, rows, hashlib.blake2b(body.encode(), digest_size=16).digest())

    def _finished(self, key: str, record: _ViewSub) -> dict[str, Any]:
        """The message of an evaluation the worker finished: rows, error or ``unchanged``."""
        head: dict[str, Any] = {"op": "view", "key": key, "epoch": record.evaluated}
        assert record.running is not None
        running, record.running = record.running, None
        try:
            result = running.result()
        except Exception as exc:  # one view's failure must not stop the tick for the others
            if not isinstance(exc, IntermediaryError):
                log.exception("intermediary: view %s failed", record.view)
            record.digest = None
            return {**head, "error": str(exc)}
        if result.digest == record.digest:
            return {**head, "unchanged": True}
        record.digest = result.digest
        return {**head, "columns": result.columns, "rows": result.rows}
