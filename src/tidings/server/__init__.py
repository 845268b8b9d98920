"""The event server: a hat-event 0.8.5 compatible, durable and redundant event log.

Where routed events arrive and are served from. It speaks the wire of :mod:`tidings.wire`
and the model of :mod:`tidings.events`; the relay writes into the same store through the
``event_store`` target. Bottom up:

- :mod:`.config`: the server's configuration file (``tidings server --conf``);
- :mod:`.store`: the log in SQLite or PostgreSQL, and every SQL statement on it (appends,
  Hat queries, reads by position, retention); :mod:`.backends` opens one as the
  configuration's ``backend.module`` names it;
- :mod:`.engine`: processing sessions run through the configured modules, each stored at
  once;
- :mod:`.writing`: the write path from asyncio (one write queue with group commit) and the
  durability contract (``durability: periodic``, early and durable listeners);
- :mod:`.change_feed`: every newly stored event, whoever wrote it, to the listeners once, in
  position order;
- :mod:`.async_engine`: the engine as asyncio code uses it, which puts those together;
- :mod:`.eventer` and :mod:`.syncer`: the two network protocols, clients (register, query,
  subscribe, notify) and the servers of a group keeping in step;
- :mod:`.monitor`: redundancy through a Hat Monitor Server; :mod:`.metrics`: Prometheus;
- :mod:`.runner`: starts the parts in hat-event's order (``tidings server``).
"""
