"""The relay: a Spark Structured Streaming query from the event log to the targets, run
under the relay lease (:mod:`tidings.pipeline.standby`), so one relay publishes from an
outbox and any other started on it stands by to take over."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from tidings.config import TidingsConfig
from tidings.db import shared_engine
from tidings.errors import RelayError
from tidings.outbox.schema import ensure_schema
from tidings.pipeline.jobconfig import job_options
from tidings.pipeline.publishing.outcome import Summary
from tidings.pipeline.spark import activate, spark_location
from tidings.pipeline.standby import OWNER_OPTION, RelayLease, check_fence

log = logging.getLogger(__name__)
#: How long a stop request waits for the batch in flight to commit.
STOP_GRACE_S = 30.0
#: Spark's error when another query wrote the same batch to the checkpoint first: a relay
#: that lost its lease froze between its source's lease check and that write
#: (:mod:`tidings.pipeline.standby`). The active relay starts its query again, this often.
_CHECKPOINT_RACE = "CONCURRENT_STREAM_LOG_UPDATE"
_CHECKPOINT_RACES = 3


def start_relay(
    spark: SparkSession,
    config: TidingsConfig,
    config_path: str | None = None,
    *,
    available_now: bool = False,
    lease_owner: str | None = None,
) -> StreamingQuery:
    """Start the relay query; with ``available_now`` it drains what is committed and stops.

    With ``lease_owner`` (the holder of the relay lease) every task and batch checks that
    the lease is still held before it publishes or commits (the fence)."""
    ensure_schema(shared_engine(config.database.url))
    activate(spark)
    options = job_options(config, config_path)
    if lease_owner is not None:
        options[OWNER_OPTION] = lease_owner
    checkpoint = spark_location(config.relay.checkpoint_dir)  # Spark creates it, also on HDFS
    stream = spark.readStream.format("tidings_outbox").options(**options).load()
    writer = (
        stream.writeStream.foreachBatch(_BatchRecorder(options))
        .option("checkpointLocation", checkpoint)
        .queryName("tidings-relay")
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        ms = int(config.relay.trigger_interval.total_seconds() * 1000)
        writer = writer.trigger(processingTime=f"{ms} milliseconds")
    query = writer.start()
    log.info("relay started", extra={"checkpoint": checkpoint, "id": str(query.id)})
    return query


class _BatchRecorder:
    """A micro-batch, run in the driver: its tasks publish their slices (collecting the
    batch runs them), then the batch's summary goes to the batch log.

    Spark writes the batch to its checkpoint's commit log only after this returns, so a
    batch cut short by a crash is run again (same id) and publishes nothing twice. Doing
    the work in the source's tasks and recording it here takes one Python worker per task
    and none per commit, where a Python sink took a second worker per task, a runner for
    its commit and a planning worker per batch.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        from tidings.pipeline.source.task import record_batch

        rows = frame.collect()
        check_fence(shared_engine(self.options["database_url"]), self.options)
        record_batch(self.options, "relay", batch_id, rows)


def _wait_between_batches(query: StreamingQuery, timeout: float) -> None:
    """Wait until ``query`` runs no trigger (or ``timeout`` passed): stopping it then
    interrupts no batch between its publishing and its commit."""
    deadline = time.monotonic() + timeout
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.05)


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
    (``on_standby`` is told the holder's name) and starts its query only once it took the
    lease (``on_active``); if it loses the lease while active, it stops its query before the
    lease can expire and stands by again. With ``once`` it waits only as long as the lease
    of a relay that died can last; a lease another relay keeps renewing is then a
    :class:`~tidings.errors.RelayError`: a drain beside an active relay has nothing to do.

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
    races = 0
    while lease.acquire(stop, patience=patience, on_standby=on_standby):
        if on_active is not None:
            on_active()
        raced = False
        try:
            raced = _run_leased(spark, config, config_path, lease, once, stop, on_replay, on_tick)
        finally:
            if not lease.lost.is_set() and not raced:
                lease.release()
        if raced:  # keeps the lease (taking it again renews it) and starts the query again
            races += 1
            if races > _CHECKPOINT_RACES:
                raise RelayError(
                    f"another streaming query keeps writing this relay's checkpoint "
                    f"({config.relay.checkpoint_dir}); is a relay without the relay lease "
                    "(an older tidings) running on it?"
                )
            continue
        if not lease.lost.is_set():
            return
        log.warning("relay lease lost; standing by again", extra={"owner": lease.owner})


def _run_leased(
    spark: SparkSession,
    config: TidingsConfig,
    config_path: str | None,
    lease: RelayLease,
    once: bool,
    stop: threading.Event,
    on_replay: Callable[[Summary], None] | None,
    on_tick: Callable[[], None] | None,
) -> bool:
    """The relay's query while this relay holds the lease (:func:`run_relay`); True when
    it failed because another query wrote the same batch to the checkpoint first."""
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
        query = start_relay(spark, config, config_path, available_now=once, lease_owner=lease.owner)
        started.append(query)
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
                _wait_between_batches(query, STOP_GRACE_S)  # asked to stop: let it commit
        finally:
            query.stop()  # also when the lease was lost while the query started
    if on_tick is not None:
        on_tick()
    failure = query.exception()
    if failure is None or lease.lost.is_set():
        return False
    if lease.holder() not in (None, lease.owner):  # fenced by a task before the watchdog
        lease.lost.set()
        return False
    if _CHECKPOINT_RACE in str(failure):
        log.warning("a stale relay wrote this relay's next batch; starting the query again")
        return True
    raise RelayError(f"the relay query failed: {failure}")


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
