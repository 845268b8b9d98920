"""Event-type and SQL-view subscriptions, fed by the event server.

A subscriber may ask for the events whose types match hat patterns (:mod:`.patterns`
decides whether upstream patterns already cover new ones) or for the rows of a read-only SQL
view over domain tables (:mod:`.sqlviews` checks and decomposes it into one primitive query
per table, :mod:`.primitives` decides their coverage, :mod:`.sqltables` holds the tables and
runs views on them). Domain tables reach the views as row-change events (:mod:`.rows`, the
convention a service emits them by). :mod:`.eventviews` serves both kinds from
double-buffered tables, and :mod:`.event_server_upstream` is its upstream: the event server,
through the public client.
"""
