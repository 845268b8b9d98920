"""The relay pipeline on Spark: the event log read in order, published to every routed target.

Bottom up:

- :mod:`~tidings.pipeline.jobconfig`: how a job's tasks get the configuration and see its
  routing change;
- :mod:`~tidings.pipeline.publishing`: publishing a set of logged events, with no Spark in
  sight: the order per key and target (the publisher), the calls with retries, narrowing
  and circuit breakers (delivery), the statuses written back (outcomes);
- :mod:`~tidings.pipeline.lease` (one replay, one housekeeping run, one active relay at a
  time) and the relay's own :mod:`~tidings.pipeline.standby` (standing by, renewing,
  fencing: the tasks check it before they publish);
- :mod:`~tidings.pipeline.source`: the event log as a Spark data source whose offset is its
  sequence and whose tasks each take a slice of the log, read it and publish it where they
  run; the job's driver collects the tasks' summaries into the batch log;
- :mod:`~tidings.pipeline.spark`, the session the jobs run on;
- the jobs: :mod:`~tidings.pipeline.replay`; the streaming relay: its query
  (:mod:`~tidings.pipeline.relay_query`), a standby's preparation to take it over
  (:mod:`~tidings.pipeline.warmup`) and the relay run under the lease
  (:mod:`~tidings.pipeline.relay`); and :mod:`~tidings.pipeline.housekeeping`, which
  archives in the Parquet layout of :mod:`~tidings.pipeline.archive_layout` (the stream
  archiver writes it too);
- what the log says about delivery (:mod:`~tidings.pipeline.status`, for ``tidings status``)
  and the relay's Prometheus :mod:`~tidings.pipeline.metrics`.

Only this layer and those above it load PySpark, and only where a job runs: the publishing
and the status report load none.
"""
