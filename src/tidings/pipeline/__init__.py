"""The relay pipeline on Spark: the event log read in order, published to every routed target.

The event log is a Spark data source (:mod:`~tidings.pipeline.source`) whose offset is its
sequence; the publishing sink (:mod:`~tidings.pipeline.sink`) runs a publishing run inside
Spark tasks: its ordering per key and target (:mod:`~tidings.pipeline.publisher`), the calls
with retries, narrowing and circuit breakers (:mod:`~tidings.pipeline.delivery`) and the
statuses written back (:mod:`~tidings.pipeline.outcome`). The streaming relay, the replay
job and housekeeping are jobs over them. Only this layer and those above it load PySpark.
"""
