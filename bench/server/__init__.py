"""Benchmark of tidings' event server against hat-event 0.8.5's own server (lmdb backend).

Run ``.venv/bin/python -m bench.server [--quick] [--only KIND]`` from the checkout. tidings
runs four times: with ``durability: commit`` (a registration is answered once committed),
with ``durability: periodic`` (answered once written, committed at most ``flush_period`` =
1 s later, as hat's lmdb backend does), and both on PostgreSQL; ``floor`` (the ``floor`` module)
answers registers and stores nothing, the ceiling of any Python server here, and
``floor_store`` and ``floor_store_periodic`` (the same module) answer them storing each
register with the SQL statements of tidings' SQLite store for that durability and nothing
else, the ceiling of a tidings server storing so. Each server runs
as a subprocess in a fresh temporary directory on a free port and is driven by the same
client, hat-event 0.8.5's ``hat.event.eventer`` (asyncio, in this process), with the same
workload:

1. register throughput: batches of 100 with ``register_with_response``, single events with
   ``register_with_response`` one at a time, and fire-and-forget ``register`` of single
   events until all are stored;
2. latest-by-type queries (``unique_type=True``) matching 100, 300 and 3,000 event types,
   and a time-ordered query of the newest 100 events: p50 and p99;
3. notify latency: register one event (one at a time) until a second, subscribed client
   receives its notify: p50 and p99;
4. hostile (``hostile``, ``--hostile on|off|only``): hostile and careless
   clients, one at a time, with a bystander client in its own process: its worst
   round trip and the server's peak RSS per row.

Every answer is checked (counts, types, newest values, order); a wrong answer fails the run.
Writes ``bench/results/server.json`` and ``bench/results/server.md`` (``results``).

Bottom up: ``workload`` (what every server is asked, how answers are checked), ``servers``
(one server under test and its run's figures and CPU), the steps ``registers``, ``queries``
and ``notify``, ``steps`` (the run through them), ``results``; ``floor`` and ``hostile`` run
in processes of their own too.
"""
