"""Benchmark of tidings' FTN18 streams, side by side with FutoIn's own server and JetStream.

Run ``.venv/bin/python -m bench.streams [--quick]`` from the checkout. In one run it measures

(a) tidings' stream server against FutoIn's own (futoin-eventstream DBGenService +
    DBPushService on a NodeExecutor, ``bench/futoin/server.js``), both on PostgreSQL and both
    driven by the same FutoIn client (``tests/interop/futoin/client.js``): a backlog drained by
    a ReliableReceiver (push), by a registered PollFace loop and by LIVE polls, and the
    generator -> consumer latency at 1,000 events/s offered (GenFace.addEvent; push and poll);
(b) tidings' Python consumer (``tidings.streams.client.consume``, push) against a NATS
    JetStream durable pull consumer through nats-py (fetch batches): drain rate and latency;

with the CPU each phase took from the server, PostgreSQL, the client and other processes,
and writes ``bench/results/streams.json`` and ``bench/results/streams.md``. Its scratch
databases (PostgreSQL on 127.0.0.1:5432), servers and work directory are removed at the end.

Bottom up: ``workload`` (paths, credentials, rates, sizes, backlogs), ``usage`` (the CPU of a
run), ``servers``, ``futoin_client``; part (a) in ``rates``, ``profile`` and ``latency``;
part (b) in ``consumer_drains`` and ``consumer_latency``; then ``results``.
"""
