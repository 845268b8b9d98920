"""NATS JetStream as a target, through nats-py.

Subjects are ``<subject_prefix>.<token>`` of the event type, or a ``subject_template``
filled from each event (:mod:`tidings.targets.destination`); every message carries the
event's fields as headers and its event id as ``Nats-Msg-Id``, by which the stream drops a
re-published event.

Bottom up: :mod:`~tidings.targets.kinds.jetstream.messages` is what goes on the wire and what
comes back (subjects, headers, sizes, acks); :mod:`~tidings.targets.kinds.jetstream.stream` is
what the target may do to its stream (create it, check it, never rewrite an ops-managed
one unasked); :mod:`~tidings.targets.kinds.jetstream.config` is the kind's configuration and
:mod:`~tidings.targets.kinds.jetstream.security` turns its credentials, nkey and TLS into
nats-py's options; :mod:`~tidings.targets.kinds.jetstream.calls` keeps one publish call's events
in flight, a key's events one ack after another; :mod:`~tidings.targets.kinds.jetstream.target`
is the :class:`~tidings.targets.kinds.jetstream.target.JetStreamTarget`, its connection and its
calls.
"""
