"""The event server's write path from asyncio: the write queue, and when a write is durable.

Every write of a running server (register sessions, synced events, the engine's status
events, commits of held writes) goes through one queue, in order, served by one thread, and
registrations waiting together are stored in one group commit (:mod:`.queue`). The
durability (:mod:`.durability`) holds the contract of ``durability: periodic``: when held
writes are committed, which listeners hear of a batch at once and which only once it is
committed, and that a store which lost held writes stops the server.
:class:`~tidings.server.async_engine.AsyncEngine` puts them together with the change feed.
"""
