"""The event server: a hat-event 0.8.5 compatible, durable and redundant event log.

Where routed events arrive and are served from. The store (:mod:`~tidings.server.store`)
keeps the log in SQLite or PostgreSQL; the engine runs each register session through the
configured modules and stores it at once; the Eventer serves clients (register, query,
subscribe, notify) and the Syncer (:mod:`~tidings.server.syncer`) keeps the servers of a
group in step; the runner starts them in hat-event's order (``tidings server``). It speaks
the wire of :mod:`tidings.wire` and the model of :mod:`tidings.events`; the relay writes
into the same store through the ``event_store`` target.
"""
