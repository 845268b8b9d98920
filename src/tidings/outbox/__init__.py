"""The producer side: a service's events written in the same transaction as its domain rows.

The first step of the flow (guarantee 1: a domain write commits if and only if its events
do). :mod:`~tidings.outbox.schema` creates and upgrades the event log's tables,
:mod:`~tidings.outbox.confirmations` reads what the log records of the confirmations at a
target (for the event-server target's re-send after a move), :mod:`~tidings.outbox.writers`
holds the writer slots an emit takes on MySQL/MariaDB (so that the relay never skips a late
commit there), :mod:`~tidings.outbox.producer` is the
:class:`~tidings.outbox.producer.Outbox` a service emits through and its transactions,
:mod:`~tidings.outbox.checks` decides what an emit accepts, and
:mod:`~tidings.outbox.envelope` holds the hooks it calls on every event. The relay
(:mod:`tidings.pipeline`) reads what is written here, in sequence order.
"""
