"""The Syncer of hat-event 0.8.5: copying one server's events to another, over chatter.

Two sides, as in hat-event's ``hat.event.syncer``: :mod:`.server` serves this store's
events to syncer clients, :mod:`.client` keeps this store up to date with one peer's own
events, and :mod:`.common` holds what both speak (the protocol's module name and the status
events they register). Which peers a server syncs with, and whether their ``syncer_token``
matches ours, is settled by the configuration (:mod:`tidings.config.server`) when it is
loaded; the client trusts what it is given.
"""
