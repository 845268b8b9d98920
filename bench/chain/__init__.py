"""The chain benchmark: tidings end to end, from the producer's commit to a reliable FTN18
consumer and to an intermediary's subscriber, on SQLite and on PostgreSQL in one run.

Run ``.venv/bin/python -m bench.chain [--quick]`` from the checkout. For each outbox
database:

* **reference**: the relay's own rate draining a backlog into the embedded event store (no
  server, no consumer): the rate the chain is measured against;
* **sustained**: the same backlog drained by the relay into an event server process (its
  ``event_server`` target), which pushes it as an FTN18 stream to a reliable consumer; the
  rate is events over the time from the relay's start until the consumer holds them all;
* **latency**: a producer commits at a steady offered rate while the streaming relay runs;
  each event's latency from its commit (its ``logged_at``) to the reliable consumer and to
  an intermediary's subscriber, and where the time goes, hop by hop: commit to the relay's
  confirmation (``last_publish_at``), commit to the server's session (its timestamp), the
  server to the consumer, the server to the subscriber.

Goals: on SQLite, latency p50 <= 250 ms and p99 <= 600 ms, and a sustained rate at least
0.7 x the reference. Writes ``bench/results/chain.json`` and ``chain.md`` with the machine
and the CPU other processes used meanwhile.

Modules: :mod:`.rig` (the server and intermediary processes, the readers),
:mod:`.phases` (the three measurements), :mod:`.__main__` (the run and its report).
"""
