"""The relay pipeline on Spark: the event log read in order, published to every routed target.

The event log is a Spark data source (:mod:`~tidings.pipeline.source`) whose offset is its
sequence and whose tasks each take a slice of the log, read it
(:mod:`~tidings.pipeline.logread`) and publish it chunk by chunk where they run
(:mod:`~tidings.pipeline.publishing`): its ordering per key and target
(:mod:`~tidings.pipeline.publisher`), the calls with retries, narrowing and circuit breakers
(:mod:`~tidings.pipeline.delivery`) and the statuses written back
(:mod:`~tidings.pipeline.outcome`). The job's driver collects the tasks' summaries into the
batch log. The streaming relay, the replay job and housekeeping are jobs over them. Only
this layer and those above it load PySpark.
"""
