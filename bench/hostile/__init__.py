"""The hostile-clients benchmark (issue 30, item 5), in two parts; ``python -m bench.hostile
[--part streams|intermediary] [--scale small|full] [--only NAME ...]``.

``streams`` (the default, :mod:`.streams`): one ``tidings server`` serves an Eventer over
``ssl+sbs://`` and an FTN18 stream over HTTP and WebSocket. Two bystanders, each a process of
its own, measure their round trips the whole time: hat-event's client over TLS (the server
benchmark's bystander, :mod:`bench.server.hostile`) and an FTN18 caller on a WebSocket
(:mod:`.bystander`). The attacks are :mod:`.attacks`'.

``intermediary`` (:mod:`.intermediary`): a ``tidings intermediary serve`` over TLS with
subscribers and grants, following that server and a spatial publisher; its bystander
(:mod:`.intermediary_bystander`) registers an event at the server and receives it through
the intermediary. The attacks are :mod:`.intermediary_attacks`'.

One attack at a time (:mod:`.runner`, shared by both parts); for each, the bystanders' p50,
p99 and worst round trip, what happened to the attacker, the attacked process's RSS growth,
whether it stayed alive and the refusals its metrics counted.
"""
