"""Publishing logged events to their routed targets, and recording what became of each.

What a relay or replay task runs over each chunk of its slice, with no Spark in it: the
:mod:`~tidings.pipeline.publishing.publisher` orders the work (lanes per key and target,
rounds, what waits behind what); :mod:`~tidings.pipeline.publishing.delivery` makes the
calls of a round, narrowing a failed call down to its culprit, behind the per-target
:mod:`~tidings.pipeline.publishing.breaker`; :mod:`~tidings.pipeline.publishing.retry`
spaces the retries; :mod:`~tidings.pipeline.publishing.outcome` holds each event's state
and writes the statuses back to the log.
"""
