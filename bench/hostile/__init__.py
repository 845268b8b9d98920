"""The hostile-clients benchmark of the streams and of TLS (issue 30, item 5).

One ``tidings server`` serves an Eventer over ``ssl+sbs://`` and an FTN18 stream over HTTP
and WebSocket. Two bystanders, each a process of its own, measure their round trips the
whole time: hat-event's client over TLS (the server benchmark's bystander,
:mod:`bench.server.hostile`) and an FTN18 caller on a WebSocket (:mod:`.bystander`). One
attack at a time (:mod:`.attacks`); for each, both bystanders' p50, p99 and worst round
trip, what happened to the attacker, the server's RSS growth and the refusals its metrics
counted. ``python -m bench.hostile [--scale small]``.
"""
