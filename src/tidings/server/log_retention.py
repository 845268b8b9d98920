"""Retention of the server's own log (``retention:`` in its file), shaped like hat-event's
lmdb limits, and what it never deletes.

Each rule (:class:`~tidings.config.log_retention.RetentionRuleConfig`) covers the stored
types its subscriptions match, unless an earlier rule matched them first. Of a rule's events
it deletes, as hat's ``ordered`` limits do, those beyond its newest ``max_entries`` and those
older than ``duration``, but never its newest ``min_entries``, nor anything younger than
``min_age`` (a re-published outbox event is recognised by its stored copy). Then it spares
what someone still needs:

* **the latest event of every type**, so that a query for a type's current value answers
  (hat keeps it in its ``latest`` table, whatever the limits);
* **what a registered stream consumer needs**: the events of its stream's types after its
  acknowledged position (the streams hold these, see
  :func:`tidings.streams.consumers.retention.consumer_needs`);
* **what a Syncer peer needs**: the events after the last id this server sent it, while it
  is connected and for ``peer_horizon`` after it left; a peer that stays away longer is
  beyond the horizon, holds nothing, and gets what is left when it comes back;
* **what an intermediary's table load needs**: the newest event of every key of a table's
  type (what :mod:`~tidings.server.store.latest_by_key` sends), for the types of ``tables``
  and those the server was asked to load since it started.

The readers are asked before every chunk's delete, not once a pass, so that one arriving
during a pass holds its events from the next chunk on.

A pass runs every ``every`` in a thread, rule by rule, in chunks of at most ``batch``
deletions, each one short transaction (:func:`~tidings.server.store.retention.
discard_chunk`), so that writers wait for one chunk at most. Each pass that deletes logs how
many events each rule deleted; the counts add up in ``tidings_server_retention_deleted``.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from tidings.config.log_retention import LogRetentionConfig
from tidings.events.matching import QueryType, TypeMatcher
from tidings.events.model import EventType
from tidings.events.timeutil import utcnow
from tidings.server.store import EventStore
from tidings.server.store.limits import (
    id_position,
    known_types,
    newest_of_keys,
    nth_newest_position,
)
from tidings.server.store.retention import Keep, discard_chunk
from tidings.server.syncer.server import SyncerServer
from tidings.tasks import run_every

log = logging.getLogger(__name__)

#: Types loaded as tables (not listed in the configuration) remembered at most.
MAX_LOADED_TABLES = 10_000

#: Says what a reader needs now: events of some types above a position (see :class:`Keep`).
Holder = Callable[[], Sequence[Keep]]


def _us(seconds: float) -> int:
    return int(seconds * 1_000_000)


class LogRetention:
    """The retention of one store's log; :meth:`run_pass` once, :meth:`run` in the
    background. Readers above the server (the streams) add what they need with
    :meth:`hold`."""

    def __init__(self, store: EventStore, config: LogRetentionConfig) -> None:
        self._store = store
        self.config = config
        self._holders: dict[int, tuple[str, Holder]] = {}
        self._tables: set[QueryType] = set(config.tables)
        self._tables_full = False
        #: Grows with every table type added, so that a pass under way sees new ones.
        self._tables_grown = 0
        self._lock = threading.Lock()
        #: Events deleted so far, by rule (its index and patterns), for the metrics.
        self.deleted: Counter[str] = Counter()
        #: Set to end a running pass after its current chunk (the server stops serving).
        self._interrupted = threading.Event()

    def hold(self, name: str, holder: Holder) -> Callable[[], None]:
        """Spare, at every pass, what ``holder`` says a reader (``name``, for the logs)
        needs; returns the call that stops it."""
        key = id(holder)
        with self._lock:
            self._holders[key] = (name, holder)
        return lambda: self._release(key)

    def _release(self, key: int) -> None:
        with self._lock:
            self._holders.pop(key, None)

    def table_loaded(self, event_type: EventType) -> None:
        """An intermediary loaded ``event_type`` as a table: spare its newest per key.

        At most :data:`MAX_LOADED_TABLES` types are remembered (a client chooses them); the
        next are refused with one warning: list them under ``tables``."""
        with self._lock:
            if len(self._tables) >= MAX_LOADED_TABLES + len(self.config.tables):
                full = not self._tables_full
                self._tables_full = True
            else:
                if tuple(event_type) not in self._tables:
                    self._tables.add(tuple(event_type))
                    self._tables_grown += 1
                return
        if full:
            log.warning(
                "server log retention: %d table types loaded, no more are remembered; list the "
                "types intermediaries load under retention.tables",
                MAX_LOADED_TABLES,
            )

    def interrupt(self) -> None:
        """End the pass under way after its current chunk."""
        self._interrupted.set()

    def rule_name(self, index: int) -> str:
        patterns = " ".join("/".join(p) for p in self.config.rules[index].subscriptions)
        return f"{index}: {patterns}"

    def run_pass(self) -> dict[str, int]:
        """One pass over every rule (blocking); the events deleted per rule that deleted."""
        now_us = _us(utcnow().timestamp())
        young_us = now_us - _us(self.config.min_age.total_seconds())
        types = known_types(self._store)
        spared = _Spared(self, types)
        done: dict[str, int] = {}
        for index, rule_types in enumerate(self._assign(types)):
            if not rule_types or self._interrupted.is_set():
                continue
            rule = self.config.rules[index]
            cap = self._store.last_position()
            if rule.min_entries:
                cap = max(nth_newest_position(self._store, rule_types, rule.min_entries) - 1, 0)
            deleted = 0
            if rule.max_entries is not None:
                beyond = nth_newest_position(self._store, rule_types, rule.max_entries + 1)
                deleted += self._sweep(rule_types, min(beyond, cap), young_us, spared)
            if rule.duration is not None:
                old_us = min(young_us, now_us - _us(rule.duration.total_seconds()))
                deleted += self._sweep(rule_types, cap, old_us, spared)
            if deleted:
                name = self.rule_name(index)
                done[name] = deleted
                self.deleted[name] += deleted
        if done:
            log.info(
                "server log retention deleted events",
                extra={"deleted": done, "held_by": sorted(spared.held_by)},
            )
        return done

    def _needs(self) -> tuple[list[str], list[Keep]]:
        """Who holds events now, and what they need (asked before every chunk's delete)."""
        with self._lock:
            holders = list(self._holders.values())
        return [name for name, _ in holders], [k for _, holder in holders for k in holder()]

    def _loaded(self) -> tuple[int, list[QueryType]]:
        """How many times the table types grew, and the table types now."""
        with self._lock:
            return self._tables_grown, list(self._tables)

    def _assign(self, types: Sequence[EventType]) -> list[list[QueryType]]:
        """Each rule's stored types: those it matches that no earlier rule matched."""
        matchers = [TypeMatcher(rule.subscriptions) for rule in self.config.rules]
        assigned: list[list[QueryType]] = [[] for _ in matchers]
        for event_type in types:
            for index, matcher in enumerate(matchers):
                if matcher.matches(event_type):
                    assigned[index].append(event_type)
                    break
        return assigned

    def _sweep(
        self, types: Sequence[QueryType], up_to: int, older_than_us: int, spared: _Spared
    ) -> int:
        """Delete chunk by chunk what :func:`discard_chunk` allows; how many."""
        deleted, after = 0, 0
        while True:
            chunk = discard_chunk(
                self._store,
                types,
                up_to,
                spared.keep,
                older_than_us,
                self.config.batch,
                after=after,
                spare=spared.newest_of_keys,
            )
            deleted += chunk.deleted
            if not chunk.examined or self._interrupted.is_set():
                return deleted
            after = chunk.examined

    async def run(self, executor: Executor) -> None:
        """Run passes every ``every`` until cancelled (then call :meth:`interrupt` to end a
        pass under way after its chunk)."""
        self._interrupted.clear()
        await run_every(
            self.config.every.total_seconds(),
            executor,
            self.run_pass,
            "server log retention pass failed",
            log,
        )


class _Spared:
    """What one pass spares, asked again before every chunk's delete: a reader that
    arrives during a pass (a consumer registered, a Syncer peer connected, a type loaded as
    a table) holds its events from the next delete on, not from the next pass."""

    def __init__(self, retention: LogRetention, types: Sequence[EventType]) -> None:
        self._retention = retention
        self._types = types
        self._grown = -1
        self._newest: set[int] = set()
        #: The types whose newest events per key are in ``_newest``.
        self._read: set[EventType] = set()
        #: Every reader that held events during the pass, for the log.
        self.held_by: set[str] = set()

    def keep(self) -> list[Keep]:
        names, keep = self._retention._needs()
        self.held_by.update(names)
        return keep

    def newest_of_keys(self) -> set[int]:
        """The newest event of every key of the table types; when they grew, of the types
        they take in now besides (each type read once a pass)."""
        grown, tables = self._retention._loaded()
        if grown != self._grown:
            store = self._retention._store
            matcher = TypeMatcher(tables)
            types = known_types(store) if self._grown >= 0 else self._types
            wanted = [t for t in types if t not in self._read and matcher.matches(t)]
            self._newest |= newest_of_keys(store, wanted)
            self._read.update(wanted)
            self._grown = grown
        return self._newest


def syncer_holder(store: EventStore, syncer: SyncerServer, horizon_s: float) -> Holder:
    """What the Syncer's peers need (see the module docstring): every event after the
    position of the last id each was sent."""
    return lambda: [
        Keep([("*",)], id_position(store, last)) for last in syncer.peer_needs(horizon_s)
    ]
