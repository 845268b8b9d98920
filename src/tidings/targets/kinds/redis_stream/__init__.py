"""Redis Streams as a target, through redis-py.

Every event becomes one entry, added with ``XADD`` to the stream its ``stream`` template
names; the entry holds the event id as the field ``event_id``, by which consumers drop a
re-published event (Redis itself cannot: delivery is at-least-once).

Bottom up: :mod:`~tidings.targets.kinds.redis_stream.entries` is what an entry holds and
how large Redis will let it be; :mod:`~tidings.targets.kinds.redis_stream.config` is the
kind's configuration; :mod:`~tidings.targets.kinds.redis_stream.target` is the
:class:`~tidings.targets.kinds.redis_stream.target.RedisStreamTarget`, its connection and its
calls.
"""
