"""Benchmark of tidings' producer and relay, side by side with raw baselines.

Run ``.venv/bin/python -m bench.relay [--quick] [--keep]`` from the checkout. It measures

1. the producer's overhead against raw ``sqlite3`` (same PRAGMAs, same outbox table) and
   against the same row written by hand with SQLAlchemy Core (``producer``);
2. relay throughput to the embedded event store (a drained backlog, ``available_now``);
   2b. the same with the outbox and the event store on PostgreSQL, and PostgreSQL's own
   work for that backlog measured with raw psycopg (``postgres_floor_ev_s``, ``pg_floor``);
   2c. how the rate holds with a backlog ten times larger, and behind millions of rows
   already published (``relay_scaling``) (all three in ``embedded``, the drains they share
   in ``drains``, what bounds a missed goal in ``breakdown``);
3. relay throughput to NATS JetStream, against raw nats-py pipelined publishing
   (``jetstream``);
4. end-to-end latency (commit -> PUBLISHED) of a streaming relay under a paced load
   (``latency``);
5. peak PSS of a relay subprocess tree (driver, JVM, Python workers) draining a backlog
   (``memory``);

and writes ``bench/results/relay.json`` and ``bench/results/relay.md`` (``results``). What
the phases share (sizes, goals, the workload, configurations) is in ``workload``. Work files
live in a temporary directory that is removed at the end. NATS JetStream must run on
127.0.0.1:4222, PostgreSQL on 127.0.0.1:5432 (trust auth; phase 2b makes and drops its own
databases).
"""
