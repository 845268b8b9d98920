"""The relay pipeline on Spark: the event log read in order, published to every routed target.

The event log is a Spark data source (:mod:`~tidings.pipeline.source`) whose offset is its
sequence and whose tasks hand on slices of the log; the publishing sink
(:mod:`~tidings.pipeline.sink`) reads each slice (:mod:`~tidings.pipeline.logread`) and
publishes it chunk by chunk inside Spark tasks (:mod:`~tidings.pipeline.publishing`): its
ordering per key and target (:mod:`~tidings.pipeline.publisher`), the calls
with retries, narrowing and circuit breakers (:mod:`~tidings.pipeline.delivery`) and the
statuses written back (:mod:`~tidings.pipeline.outcome`). The streaming relay, the replay
job and housekeeping are jobs over them. Only this layer and those above it load PySpark.
"""
