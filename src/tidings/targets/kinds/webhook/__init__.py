"""HTTP webhooks as a target: every event POSTed as a CloudEvent, through httpx.

An endpoint's URL may be a template filled from each event
(:mod:`tidings.targets.destination`); each request carries the event id as an idempotency key
header, by which the receiver drops a re-sent event (delivery is at-least-once).

Bottom up: :mod:`~tidings.targets.kinds.webhook.cloudevent` is what goes on the wire (the
CloudEvents HTTP binding, binary or structured mode); :mod:`~tidings.targets.kinds.webhook.config`
is the kind's configuration (URL, mode, timeouts, TLS, auth headers from the environment,
retries, concurrency); :mod:`~tidings.targets.kinds.webhook.answers` reads what came back
(confirmed, retried, refused, unreachable; ``Retry-After``);
:mod:`~tidings.targets.kinds.webhook.target` is the
:class:`~tidings.targets.kinds.webhook.target.WebhookTarget`, its client and its calls.
"""
