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

The consumer events (:mod:`.replication`) are left to their own compaction
(:mod:`.compaction`), which runs with or without retention.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from tidings.config.streams import StreamConfig
from tidings.events.timeutil import utcnow
from tidings.server.store import EventStore
from tidings.server.store.retention import Keep, discard
from tidings.streams.consumers.positions import Consumers
from tidings.streams.typemap import type_map_from_config
from tidings.tasks import run_every

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
    return total


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
    await run_every(
        every,
        executor,
        lambda: retention_pass(store, consumers, streams),
        "stream retention pass failed",
        log,
    )


def consumer_needs(consumers: Consumers, streams: Sequence[StreamConfig]) -> list[Keep]:
    """What the registered consumers need of the server's log (its ``retention:``, see
    :mod:`tidings.server.log_retention`): the events of each stream's types after the lowest
    position of its consumers; a stream without consumers needs nothing."""
    needs = []
    for stream in streams:
        lowest = consumers.lowest_position(stream.name)
        if lowest is not None:
            patterns = tuple(type_map_from_config(stream.types).all_patterns())
            needs.append(Keep(patterns, lowest))
    return needs
