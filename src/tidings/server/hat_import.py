"""Bringing a hat-event 0.8.5 lmdb database into a tidings event store (``tidings
import-hat``).

Every event the lmdb database holds (:class:`~tidings.server.hat_lmdb.HatLmdb`) is stored
with its own id, timestamps, type and payload by the store's Syncer path
(:meth:`EventStore.append_synced <tidings.server.store.EventStore.append_synced>`): as if
each of its servers had been a Syncer peer of this store. The servers' events are merged by
timestamp (then id), so the positions stream consumers see follow time across servers, and
stored in batches of one transaction each.

**Resuming.** A batch is a prefix of that merge, and each server's events in it are a prefix
of that server's events, so after any number of committed batches the store holds, per
server, every event up to its last stored id and none after. A new run reads each server's
events after :meth:`~tidings.server.store.EventStore.last_event_id` and goes on: an
interrupted import (killed, a database gone) is run again to finish, and a finished one
again stores nothing. It also continues a store a tidings Syncer already filled from the same
hat server (a mixed pair during a move).

**Continuing.** At the end the session and instance counters of every server of hat's
``SYSTEM`` table move past its last registered id (:meth:`EventStore.continue_after
<tidings.server.store.EventStore.continue_after>`), stored or not, so a tidings server with
hat's ``server_id`` numbers its sessions after hat's.

**Checking.** Then the database is read again, in the same snapshot (a hat server that
goes on running adds events, and its limits delete some, in a later one), and, for the
events up to each server's last one read, the count and the latest event (by timestamp, then
id) of every type must be the same in the store (:func:`~tidings.server.store.census.
census`); the report says so or lists the differences.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tidings.errors import UsageError
from tidings.events.model import EventId, EventType, StoredEvent
from tidings.server.hat_lmdb import HatLmdb
from tidings.server.store import EventStore
from tidings.server.store.census import census

#: Events per transaction, unless told otherwise.
DEFAULT_BATCH = 5000
#: Differences listed in a report at most (the rest are counted).
_LISTED = 20


@dataclass
class ImportReport:
    """What a run did and found."""

    #: Events stored by this run (an earlier, interrupted run stored the others).
    imported: int = 0
    #: Each server's last registered id in hat's database, which the store now continues.
    servers: dict[int, EventId] = field(default_factory=dict)
    #: The events and types checked, and the differences found (none: the import is equal).
    checked_events: int = 0
    checked_types: int = 0
    differences: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not self.differences

    def as_json(self) -> dict[str, object]:
        return {
            "imported": self.imported,
            "servers": {
                str(s): [i.server, i.session, i.instance] for s, i in sorted(self.servers.items())
            },
            "checked_events": self.checked_events,
            "checked_types": self.checked_types,
            "equal": self.equal,
            "differences": self.differences,
        }


def import_hat(
    path: Path,
    store: EventStore,
    *,
    batch: int = DEFAULT_BATCH,
    progress: Callable[[int], None] = lambda _: None,
) -> ImportReport:
    """Import the lmdb database at ``path`` into ``store`` (see the module docstring);
    ``progress`` is told the run's stored count after each batch."""
    if batch < 1:
        raise UsageError(f"batch: must be at least 1, not {batch}")
    report = ImportReport()
    with HatLmdb(path) as source:
        report.servers = source.last_ids()
        merged = heapq.merge(
            *(
                source.events(server, store.last_event_id(server))
                for server in sorted(report.servers)
            ),
            key=_order,
        )
        while chunk := list(itertools.islice(merged, batch)):
            report.imported += len(store.append_synced(chunk))
            progress(report.imported)
        store.continue_after(list(report.servers.values()))
        _check(source, store, report)
    return report


def _order(event: StoredEvent) -> tuple[int, int, int, int]:
    return (event.timestamp_us, event.id.server, event.id.session, event.id.instance)


def _check(source: HatLmdb, store: EventStore, report: ImportReport) -> None:
    """Compare the count and the latest event of each type (see the module docstring), in
    the snapshot the import read: the database of a hat server that goes on running (or
    whose limits delete) has other events in a later one."""
    counts: Counter[EventType] = Counter()
    latest: dict[EventType, StoredEvent] = {}
    last: dict[int, EventId] = {}
    for event in _all_events(source, report.servers):
        counts[event.type] += 1
        if event.type not in latest or _order(event) > _order(latest[event.type]):
            latest[event.type] = event
        last[event.id.server] = event.id
    stored_counts, stored_latest = census(store, last)
    report.checked_events = sum(counts.values())
    report.checked_types = len(counts)
    differences = [
        f"type {list(t)}: {counts.get(t, 0)} event(s) in hat's database, "
        f"{stored_counts.get(t, 0)} in the store"
        for t in sorted(counts.keys() | stored_counts.keys())
        if counts.get(t, 0) != stored_counts.get(t, 0)
    ]
    differences += [
        f"type {list(t)}: latest event {_id(e.id)} in hat's database, "
        f"{_id(stored_latest[t]) if t in stored_latest else 'none'} in the store"
        for t, e in sorted(latest.items())
        if stored_latest.get(t) != e.id
    ]
    report.differences = differences[:_LISTED]
    if len(differences) > _LISTED:
        report.differences.append(f"... and {len(differences) - _LISTED} more")


def _all_events(source: HatLmdb, servers: dict[int, EventId]) -> Iterator[StoredEvent]:
    for server in sorted(servers):
        yield from source.events(server, EventId(server, 0, 0))


def _id(event_id: EventId) -> str:
    return f"{event_id.server}/{event_id.session}/{event_id.instance}"
