"""The relay pipeline on Spark: the event log read in order, published to every routed target.

The event log is a Spark data source (:mod:`~tidings.pipeline.source`) whose offset is its
sequence; the publishing sink (:mod:`~tidings.pipeline.sink`) runs the delivery algorithm
(:mod:`~tidings.pipeline.publisher`: per-key order per target, retries, narrowing, the
circuit breaker) inside Spark tasks. The streaming relay, the replay job and housekeeping
are jobs over them. Only this layer (and the parts above it) loads PySpark.
"""
