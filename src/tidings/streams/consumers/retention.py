"""Stream retention (FTN18 2.3.1): events leave the active store once every registered
consumer of every stream that carries them has acknowledged them.

A stream with ``retention.enabled`` discards, every ``retention.every``, its events up to
the lowest position of its registered consumers, older than ``retention.min_age``. An event
that another stream also carries stays until that stream's consumers are past it too, and
for ever if that stream keeps everything (no retention). A stream with no registered
consumer discards nothing: no one has said what it may forget. To archive before
discarding, run the archiver (``tidings streams archive``): it is a registered consumer, so
an event is never discarded before it is archived. A consumer that is gone for good holds
everything back until it is unregistered (``tidings streams unregister``); its lag shows in
``tidings streams status``.

A pass also discards the consumer events (:mod:`.replication`) that a later one of the same
consumer and origin server supersedes, once they are applied here and older than the
shortest ``min_age``: they would otherwise grow the log by one event per acknowledgement.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from tidings.config.streams import StreamConfig
from tidings.events.timeutil import utcnow
from tidings.server.store import EventStore
from tidings.server.store.retention import Keep, discard
from tidings.streams.consumers.positions import Consumers
from tidings.streams.consumers.replication import CONSUMER_PATTERN
from tidings.streams.typemap import type_map_from_config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Stream:
    config: StreamConfig
    patterns: tuple[tuple[str, ...], ...]


def retention_pass(store: EventStore, consumers: Consumers, streams: Sequence[StreamConfig]) -> int:
    """Discard what the streams' retention allows now (blocking); how many events left."""
    described = [_Stream(s, tuple(type_map_from_config(s.types).all_patterns())) for s in streams]
    bounds = {s.config.name: _bound(consumers, s.config) for s in described}
    total = 0
    for stream in described:
        retention = stream.config.retention
        up_to = bounds[stream.config.name]
        if not retention.enabled or up_to is None:
            continue
        keep = [
            Keep(other.patterns, bounds[other.config.name] or 0)
            for other in described
            if other is not stream
        ]
        cutoff_us = int((utcnow() - retention.min_age).timestamp() * 1_000_000)
        discarded = 0
        while True:
            deleted = discard(store, stream.patterns, up_to, keep, cutoff_us, retention.batch)
            discarded += deleted
            if deleted < retention.batch:
                break
        if discarded:
            log.info(
                "stream retention discarded events",
                extra={"stream": stream.config.name, "up_to": up_to, "discarded": discarded},
            )
        total += discarded
    return total + _discard_consumer_events(store, consumers, streams)


def _discard_consumer_events(
    store: EventStore, consumers: Consumers, streams: Sequence[StreamConfig]
) -> int:
    """Discard the superseded consumer events (see the module docstring)."""
    ages = [s.retention.min_age for s in streams if s.retention.enabled]
    if not ages:
        return 0
    cutoff_us = int((utcnow() - min(ages)).timestamp() * 1_000_000)
    up_to = consumers.synced()
    discarded = 0
    while deleted := discard(store, [CONSUMER_PATTERN], up_to, [], cutoff_us):
        discarded += deleted
    return discarded


def _bound(consumers: Consumers, stream: StreamConfig) -> int | None:
    """Up to where the stream's consumers allow discarding; None: nowhere (keep all)."""
    if not stream.retention.enabled:
        return None
    return consumers.lowest_position(stream.name)


async def run_retention(
    store: EventStore,
    consumers: Consumers,
    streams: Sequence[StreamConfig],
    executor: Executor,
) -> None:
    """Run retention passes until cancelled, at the shortest ``every`` of the streams."""
    every = min(s.retention.every.total_seconds() for s in streams if s.retention.enabled)
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(every)
        try:
            await loop.run_in_executor(executor, retention_pass, store, consumers, streams)
        except Exception:
            log.exception("stream retention pass failed; retrying at the next one")
