"""The relay: a Spark Structured Streaming query from the event log to the targets
(:mod:`tidings.pipeline.relay_query`), run under the relay lease
(:mod:`tidings.pipeline.standby`), so one relay publishes from an outbox and any other
started on it stands by, prepared to take over (:mod:`tidings.pipeline.warmup`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from tidings.config import TidingsConfig
from tidings.db import shared_engine
from tidings.errors import RelayError
from tidings.outbox.schema import ensure_schema
from tidings.pipeline.publishing.outcome import Summary
from tidings.pipeline.relay_query import start_relay, start_writer, wait_between_batches
from tidings.pipeline.standby import RelayLease
from tidings.pipeline.warmup import WarmStandby

log = logging.getLogger(__name__)
#: How long a stop request waits for the batch in flight to commit.
STOP_GRACE_S = 30.0
#: Failures after which the active relay keeps its lease and starts its query again (from
#: the checkpoint, as after a crash), at most :data:`_RESTARTS` times in a row each: what
#: Spark's error says -> what the relay logs, and what it fails with when they keep coming.
_TRANSIENT = {
    # Another query wrote the same batch to the checkpoint first: a relay that lost its lease
    # froze between its source's lease check and that write (tidings.pipeline.standby).
    "CONCURRENT_STREAM_LOG_UPDATE": (
        "a stale relay wrote this relay's next batch",
        "another streaming query keeps writing this relay's checkpoint ({checkpoint}); is a "
        "relay without the relay lease (an older tidings) running on it?",
    ),
    # A Python process Spark started (the query's streaming source) did not connect back
    # within the 10 s Spark waits, fixed: a machine too busy to start one in time.
    "Python worker failed to connect back": (
        "a Python process of Spark's did not start in time (is the machine overloaded?)",
        "Spark's Python processes keep failing to start within 10 s; is the machine overloaded?",
    ),
}
_RESTARTS = 3


def run_relay(
    spark: SparkSession,
    config: TidingsConfig,
    config_path: str | None = None,
    *,
    once: bool = False,
    stop: threading.Event | None = None,
    on_replay: Callable[[Summary], None] | None = None,
    on_tick: Callable[[], None] | None = None,
    on_standby: Callable[[str], None] | None = None,
    on_active: Callable[[], None] | None = None,
) -> None:
    """Run the relay until ``stop`` is set (or, with ``once``, until the log is drained).

    The relay first takes the relay lease. While another relay holds it, this one stands by
    (``on_standby`` is told the holder's name), prepared: its query built and a warm-up
    query running on the same code paths (:mod:`tidings.pipeline.warmup`); it starts its
    query only once it took the lease (``on_active``); if it loses the lease while active,
    it stops its query before the lease can expire and stands by again. With ``once`` it
    waits only as long as the lease of a relay that died can last; a lease another relay
    keeps renewing is then a :class:`~tidings.errors.RelayError`: a drain beside an active
    relay has nothing to do.

    The relay itself resumes events held while a target was down and sends retries when they
    are due (carry-over, :mod:`tidings.pipeline.source.datasource`). If
    ``relay.replay_every`` is set, the replay job also runs on that schedule in the same
    Spark session and tries FAILED events (past their last try) again at once.

    ``on_tick`` is called from this loop about twice a second and once after the query
    stopped: the driver's own thread, where following the batch log for metrics and progress
    is safe (a Spark listener called back through Py4J fails while the session shuts down).
    Setting ``stop`` (the CLI does on SIGINT and SIGTERM) stops the query between two
    batches, with no exception: the batch in flight may finish and commit first (for up to
    :data:`STOP_GRACE_S`); a batch stopped before its commit is taken again by the next run
    and its events are not sent twice to a target that deduplicates.
    """
    stop = stop if stop is not None else threading.Event()
    engine = shared_engine(config.database.url)
    ensure_schema(engine)
    lease = RelayLease(engine, config.relay.lease)
    # A drain waits out the lease of a relay that died, not one that keeps renewing it.
    patience = lease.ttl + lease.poll_every if once else None
    # A drain does not stand by: it has no takeover to prepare.
    standby = None if once else WarmStandby(spark, config, config_path, lease.owner)

    def standing_by(holder: str) -> None:
        if on_standby is not None:
            on_standby(holder)
        if standby is not None:
            standby.prepare()

    restarts: dict[str, int] = {}
    try:
        while lease.acquire(stop, patience=patience, on_standby=standing_by):
            if on_active is not None:
                on_active()
            restart: _Restart | None = None
            try:
                restart = _run_leased(
                    spark, config, config_path, lease, once, stop, standby, on_replay, on_tick
                )
            finally:
                if not lease.lost.is_set() and restart is None:
                    lease.release()
            if restart is not None:  # keeps the lease (taking it again renews it)
                count = 1 if restart.progressed else restarts.get(restart.cause, 0) + 1
                restarts[restart.cause] = count
                if count > _RESTARTS:
                    checkpoint = config.relay.checkpoint_dir
                    why = _TRANSIENT[restart.cause][1].format(checkpoint=checkpoint)
                    raise RelayError(f"{why} (last: {restart.failure})")
                continue
            if not lease.lost.is_set():
                return
            log.warning("relay lease lost; standing by again", extra={"owner": lease.owner})
    finally:
        if standby is not None:
            standby.close()  # stopped while standing by


def _run_leased(
    spark: SparkSession,
    config: TidingsConfig,
    config_path: str | None,
    lease: RelayLease,
    once: bool,
    stop: threading.Event,
    standby: WarmStandby | None,
    on_replay: Callable[[Summary], None] | None,
    on_tick: Callable[[], None] | None,
) -> _Restart | None:
    """The relay's query while this relay holds the lease (:func:`run_relay`): the one
    ``standby`` prepared while standing by, else built now; a :class:`_Restart` when it
    failed for a passing reason and is to be started again."""
    from tidings.pipeline.replay import run_replay

    every = config.relay.replay_every
    period = every.total_seconds() if every is not None and not once else None
    next_replay = time.monotonic() + (period or 0.0)
    started: list[StreamingQuery] = []

    def stop_started() -> None:
        for running in started:
            running.stop()

    # Renewing from the moment the lease was taken: starting the query may outlast a TTL.
    with lease.guard(on_lost=stop_started):
        prepared = None if standby is None else standby.take()
        if prepared is not None:
            query = start_writer(prepared, config)
        else:
            owner = lease.owner
            query = start_relay(spark, config, config_path, available_now=once, lease_owner=owner)
        started.append(query)
        if standby is not None:
            standby.close()  # the warm-up stops while the query starts
        try:
            while query.isActive and not stop.is_set() and not lease.lost.is_set():
                try:
                    # PySpark takes seconds as a float here; its annotation says int.
                    query.awaitTermination(0.5)  # type: ignore[arg-type]
                except StreamingQueryException:
                    break  # raised below as a RelayError, with Spark's reason
                if on_tick is not None:
                    on_tick()
                if period is not None and time.monotonic() >= next_replay:
                    _scheduled_replay(run_replay, spark, config, config_path, on_replay)
                    next_replay = time.monotonic() + period
            if query.isActive and not lease.lost.is_set():
                wait_between_batches(query, STOP_GRACE_S)  # asked to stop: let it commit
        finally:
            query.stop()  # also when the lease was lost while the query started
    if on_tick is not None:
        on_tick()
    failure = query.exception()
    if failure is None or lease.lost.is_set():
        return None
    if lease.holder() not in (None, lease.owner):  # fenced by a task before the watchdog
        lease.lost.set()
        return None
    for cause, (what, _) in _TRANSIENT.items():
        if cause in str(failure):
            log.warning(f"{what}; starting the query again")
            return _Restart(cause, str(failure).splitlines()[0], query.lastProgress is not None)
    raise RelayError(f"the relay query failed: {failure}")


class _Restart(NamedTuple):
    """The relay query failed for a passing reason (:data:`_TRANSIENT`): start it again."""

    cause: str  # the key of _TRANSIENT
    failure: str  # Spark's error, its first line
    progressed: bool  # a batch ran before it failed: the failures in a row start again


def _scheduled_replay(
    run_replay: Callable[..., Summary],
    spark: SparkSession,
    config: TidingsConfig,
    config_path: str | None,
    on_replay: Callable[[Summary], None] | None,
) -> None:
    try:
        summary = run_replay(spark, config, config_path)
    except Exception:  # the next scheduled run tries again; the relay goes on
        log.exception("scheduled replay failed")
    else:
        if on_replay is not None and summary.events:
            on_replay(summary)
