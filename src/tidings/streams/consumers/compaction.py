"""Keeping the consumer events few: only the latest of each consumer and origin matters.

Every acknowledgement that moves a consumer writes a consumer event (:mod:`.replication`),
one per write of its position (replies that arrive while a write is under way share the
next one). Each carries the whole covers its origin server knew of the consumer, which only
grow, so the latest event of a type (one consumer, one origin server) says everything the
earlier ones said. A compaction pass, run every ``stream_consumer_events.compact_every``
whether or not any stream has retention, deletes the ones nobody needs:

- every consumer event but the latest of its type;
- all the events of a consumer that is not registered here (the operator unregistered it):
  kept, the latest would register it again on a server that syncs this one's events later
  (one that was down, or a new one);
- the malformed ones (the sync skipped them with a warning).

Only events this server has applied go: its own (applied as they were written) and the
peers' up to the consumer sync's position (:meth:`.positions.Consumers.synced`).

What the peers need is kept. A peer that is behind (down, partitioned, or reconnecting
after a pass) asks this server's Syncer for this server's own events after the last it
holds, and gets the latest consumer event of each consumer, which carries what the deleted
ones carried; it moves that consumer as far as those would have. Only a server's own
events are served by its Syncer, so the peers' events here are needed only until they are
applied.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Executor

from tidings.events.model import EventType, StoredEvent
from tidings.server.store import EventStore
from tidings.server.store.positions import read_positions
from tidings.streams.consumers.positions import Consumers
from tidings.streams.consumers.replication import CONSUMER_PATTERN
from tidings.streams.typemap import CONSUMER_TYPE
from tidings.tasks import run_every

log = logging.getLogger(__name__)

#: Consumer events read per step.
_STEP = 1000
#: Segments of a consumer event's type after the reserved prefix: stream, user, component,
#: origin server.
_NAMED = 4


def compaction_pass(store: EventStore, consumers: Consumers) -> int:
    """Delete the consumer events nobody needs (see the module docstring); how many.
    Blocking.

    The reads come in the order that keeps a consumer's newest word: the sync's position
    first (every peer event up to it was applied, registering its consumer), then the
    events, then the registered consumers (a consumer registers before its first event is
    written, so one whose event was read and that is not registered now was unregistered)."""
    applied = consumers.synced()
    events = _consumer_events(store)
    registered = consumers.registered()
    latest: dict[EventType, int] = {}
    for event in events:
        if _well_formed(event):
            latest[event.type] = event.position
    doomed = []
    for event in events:
        if event.id.server != store.server_id and event.position > applied:
            continue  # not applied here yet
        if (
            _well_formed(event)
            and latest[event.type] == event.position
            and tuple(event.type[len(CONSUMER_TYPE) : -1]) in registered
        ):
            continue
        doomed.append(event.position)
    deleted = store.delete_positions(doomed) if doomed else 0
    if deleted:
        log.info("stream consumer events compacted", extra={"deleted": deleted})
    return deleted


def _consumer_events(store: EventStore) -> Sequence[StoredEvent]:
    """Every consumer event in the log, in position order."""
    events: list[StoredEvent] = []
    after = 0
    while True:
        found = read_positions(store, after, _STEP, [CONSUMER_PATTERN])
        events += found.events
        if len(found.events) < _STEP:
            return events
        after = found.scanned


def _well_formed(event: StoredEvent) -> bool:
    """Whether the event's type names a consumer and its origin, the server that wrote it."""
    return len(event.type) == len(CONSUMER_TYPE) + _NAMED and event.type[-1] == str(event.id.server)


async def run_compaction(
    store: EventStore, consumers: Consumers, every: float, executor: Executor
) -> None:
    """Run compaction passes every ``every`` seconds until cancelled."""
    await run_every(
        every,
        executor,
        lambda: compaction_pass(store, consumers),
        "stream consumer compaction failed",
        log,
    )
