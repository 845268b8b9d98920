"""Routing: which targets each event type goes to, many-to-many and changeable while running.

The routes of the configuration and of the ``tidings_route`` table, merged into one snapshot
(:mod:`~tidings.routing.table`). The relay reads a fresh snapshot every micro-batch and the
producer checks an emit against the targets it is routed to; neither restarts for a change.
"""
