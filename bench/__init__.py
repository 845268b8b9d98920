"""tidings' benchmarks: each measures one part of tidings against a reference outside it.

Run one from the checkout's root as ``.venv/bin/python -m bench.<name>``; ``--quick`` takes
small sizes (to check that it runs: its figures are not comparable) and ``--help`` lists the
rest. Each writes ``bench/results/<name>.json`` (for comparing runs) and ``<name>.md`` (for
reading), with the machine, the code measured and the CPU other processes took meanwhile.

- ``relay``: the producer against raw ``sqlite3`` and a hand-rolled SQLAlchemy Core outbox;
  the relay's drain rate into the event store (on SQLite and on PostgreSQL, and as the
  backlog and the log grow) and to NATS JetStream against raw nats-py publishing; its
  commit-to-PUBLISHED latency under a paced load; the peak memory of its process tree.
- ``outage``: how the streaming relay recovers from a JetStream outage under steady traffic:
  recovery time, latency before and after, every event once and in per-key order.
- ``server``: the event server against hat-event 0.8.5's own server driven by the same
  client (register rates, latest and ordered queries, notify latency), on SQLite and
  PostgreSQL, with a floor server that stores nothing and hostile clients.
- ``rabbitmq``: the rabbitmq target's publishing rate against raw aiormq publishing the same
  persistent, mandatory, confirmed messages (many keys at once, and one key's run); it only
  prints its figures.
- ``streams``: the FTN18 streams against FutoIn's own server driven by the same FutoIn
  client (drain rates, latency), and tidings' Python consumer against a NATS JetStream pull
  consumer.
- ``fanout``: the intermediaries' fan-out of a moving-agents simulation to many subscribers
  in other processes (staleness, each subscriber's rate, upstream bytes against every
  subscriber fed directly), and the largest subscriber count that still holds the goals.
- ``webhook``: the webhook target against a plain httpx client posting the same CloudEvents
  to one local endpoint at the same confirmation level (events/s).

``harness`` is what they share: sizes, the report and its files, the CPU accounting and the
processes they start (the tests start their servers with ``bench.harness.processes`` too).
"""
