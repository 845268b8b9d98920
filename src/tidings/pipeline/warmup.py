"""A standby relay's preparation: everything its takeover needs that does not need the lease.

A standby that only waited for the lease started everything after taking it, and most of
its takeover went there, not to the lease (``bench/relay_takeover.py``, whose log lines
mark each step): building the streaming DataFrame (Spark starts a Python process to create
the data source), the JVM's first run of Spark's streaming, planning and ``foreachBatch``
code, the first Python worker of a task (its start, tidings' imports, the configuration,
the routes, the target clients) and the driver's first import of the batch recorder. None
of it needs the lease, so while it stands by a relay (:class:`WarmStandby`):

* builds its relay query, not started (:func:`~tidings.pipeline.relay_query.relay_writer`);
* runs a warm-up query on the same code paths
  (:func:`~tidings.pipeline.relay_query.warm_up_writer`): the same source in a mode that
  reads nothing, one task per trigger that loads what a relay task loads, the same
  ``foreachBatch``. It triggers every :data:`WARM_EVERY_S`: Spark stops a Python worker
  left idle for a minute, and a batch in time keeps the worker, its imports and its
  targets' clients for the relay query's first task (``spark.python.worker.reuse``).

On taking the lease the relay starts the prepared query, then lets the warm-up's batch in
flight end and stops the warm-up while the query starts. What is left of a takeover is the
lease's expiry, the start of the query's own streaming source (a Python process Spark starts
for each query) and the first batch's work.

The warm-up can do no harm: it has no lease owner, reads no event, writes no status and no
batch log, and its checkpoint is its own, in a temporary directory on the driver's disk;
the relay's checkpoint is only read by the query started under the lease. A preparation
that fails is logged and the relay starts cold, as it did before.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from tidings.config import TidingsConfig
from tidings.pipeline.relay_query import relay_writer, wait_between_batches, warm_up_writer

log = logging.getLogger(__name__)
#: How often the warm-up query runs its empty batch: well within the minute after which
#: Spark stops an idle Python worker.
WARM_EVERY_S = 20.0
#: How long stopping the warm-up waits for its batch in flight (its worker is the one the
#: relay query's first task reuses).
WARM_BATCH_WAIT_S = 30.0


class WarmStandby:
    """The relay query built and the warm-up running while this relay stands by.

    The preparation runs in a thread of its own, so that the standby goes on polling the
    lease and announcing itself meanwhile; taking the prepared query (or closing) waits for
    it to end."""

    def __init__(
        self,
        spark: SparkSession,
        config: TidingsConfig,
        config_path: str | None,
        lease_owner: str,
    ) -> None:
        self.spark, self.config, self.config_path = spark, config, config_path
        self.lease_owner = lease_owner
        self._thread: threading.Thread | None = None
        self._writer: DataStreamWriter | None = None
        self._warm_up: StreamingQuery | None = None
        self._checkpoint: Path | None = None

    def prepare(self) -> None:
        """Start preparing (building the relay query, starting the warm-up), unless it is
        under way or done."""
        if self._thread is not None or self._writer is not None:
            return
        self._thread = threading.Thread(
            target=self._prepare, name="relay-standby-prepare", daemon=True
        )
        self._thread.start()

    def prepared(self) -> bool:
        """Whether a relay query is prepared (once the preparation under way ended)."""
        self._join()
        return self._writer is not None

    def take(self) -> DataStreamWriter | None:
        """The prepared relay query, once (after the preparation under way ended); None if
        nothing was prepared. The warm-up runs on until :meth:`close`: the relay starts its
        query first and stops the warm-up while that query starts (Spark starts a Python
        process for its source meanwhile)."""
        self._join()
        writer, self._writer = self._writer, None
        return writer

    def close(self) -> None:
        """Stop the warm-up (after its batch in flight) and remove its checkpoint."""
        self._join()
        self._stop_warm_up()

    def _prepare(self) -> None:
        """Build the relay query and start the warm-up; a failure is logged, and the
        takeover then starts cold."""
        began = time.monotonic()
        try:
            self._writer = relay_writer(
                self.spark, self.config, self.config_path, lease_owner=self.lease_owner
            )
            self._checkpoint = Path(tempfile.mkdtemp(prefix="tidings-warm-up-"))
            warm_up = warm_up_writer(
                self.spark,
                self.config,
                self.config_path,
                self._checkpoint.as_uri(),  # the driver's own disk, also on a cluster
                WARM_EVERY_S,
            )
            self._warm_up = warm_up.start()
        except Exception:
            log.warning(
                "standby relay: preparing the takeover failed; it will start cold", exc_info=True
            )
            self._writer = None
            self._stop_warm_up()
            return
        log.info("standby relay prepared", extra={"seconds": round(time.monotonic() - began, 3)})

    def _join(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    def _stop_warm_up(self) -> None:
        warm_up, self._warm_up = self._warm_up, None
        if warm_up is not None:
            try:
                wait_between_batches(warm_up, WARM_BATCH_WAIT_S)
                warm_up.stop()
            except Exception:  # it reads and writes nothing: a failure to stop is only noted
                log.warning("standby relay: stopping the warm-up query failed", exc_info=True)
        checkpoint, self._checkpoint = self._checkpoint, None
        if checkpoint is not None:
            shutil.rmtree(checkpoint, ignore_errors=True)
