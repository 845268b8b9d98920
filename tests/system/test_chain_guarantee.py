"""The chain's guarantee, end to end, with every part crashed while events flow through it:
nothing lost, duplicated where it must not be, or reordered, from the producers' commits to
the readers.

Producers commit on PostgreSQL from several threads out of sequence order, within a
partition key too (a transaction holds on after taking its sequence numbers, some for several
relay trigger intervals, while later-numbered ones commit), and roll a share of their
transactions back
(:mod:`tests.support.producers`). The relay (``tidings relay``, real Spark) feeds an event
server (``tidings server``) through its ``event_server`` target; the server serves an FTN18
stream to a pushed and a polling reliable consumer (``tidings consume``, writing JSON lines),
and an intermediary (``tidings intermediary serve``) serves a SQL view over the table the
producers write, fed by row events, to a subscriber that watches it throughout
(:mod:`tests.support.view_watcher`). Each process (relay, server, intermediary, both
consumers) is SIGKILLed once it is seen moving events, at a random moment, and started
again; the test restarts a part that ended on its own too, as ``tidings run`` would
(:mod:`tests.support.child_parts`).

Asserted against what was committed (the outbox rows and the domain table):

- commits of one key did land out of sequence order, and rolled-back transactions left no
  row;
- the store holds each committed event once, per key in sequence order, and nothing else;
- each reliable consumer got every committed event of its stream at least once, as
  committed, per key in order of first delivery, and nothing else;
- the intermediary's view converges to the source rows, and the watching subscriber never
  saw a row go back to an older value, across the intermediary's crash;
- every outbox row is PUBLISHED;
- no part ended on its own, but the intermediary when started again before its event
  server listened (it rides out a lost server once running, but will not start without one).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from bench.harness.processes import free_port, local_address, wait_for_port
from tests.support.chain_checks import (
    MOVED,
    PASSWORD,
    USER,
    VIEW,
    WAIT,
    Outcome,
    all_published,
    chain_file,
    chain_outbox,
    chain_server,
    counter_view_intermediary,
    never_older,
    published,
    source_rows,
    stop_all,
    write_counted,
)
from tests.support.child_parts import ChildPart, Progress, supervised_wait, wait_moving
from tests.support.producers import OutOfOrderProducers
from tests.support.view_watcher import ViewWatcher
from tidings.outbox.producer import Outbox

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.postgres, pytest.mark.sockets]


def test_every_committed_event_reaches_every_reader_across_crashes(
    pg_url: str, tmp_path: Path
) -> None:
    ports = {"eventer": free_port(), "stream": free_port(), "live": free_port()}
    eventer = local_address(ports["eventer"])
    path = chain_file(
        tmp_path,
        pg_url,
        {"address": eventer},
        {"main": chain_server(1, "events.db", eventer, ports["stream"])},
        counter_view_intermediary(ports["live"], eventer),
    )
    engine = chain_outbox(pg_url)
    stream = f"http://127.0.0.1:{ports['stream']}/chain"
    login = {"TIDINGS_STREAM_USER": USER, "TIDINGS_STREAM_PASSWORD": PASSWORD}
    server = ChildPart("server", ["server", "-c", path, "--name", "main"], tmp_path)
    relay = ChildPart("relay", ["relay", "-c", path], tmp_path)
    live = ChildPart(
        "intermediary", ["intermediary", "serve", "-c", path, "--name", "live"], tmp_path
    )
    pushed = ChildPart("pushed", ["consume", stream, "Pushed"], tmp_path, login)
    polling = ChildPart("polling", ["consume", stream, "Polling", "--poll"], tmp_path, login)
    parts = [server, relay, live, pushed, polling]
    watcher = ViewWatcher(f"ws://127.0.0.1:{ports['live']}/", VIEW)
    producers = OutOfOrderProducers(Outbox(engine), write_counted)
    rng = random.Random(28)
    try:
        server.start()
        wait_for_port(ports["eventer"], 60, log=server.log)
        for part in (relay, live, pushed, polling):
            part.start()
        wait_for_port(ports["live"], 60, log=live.log)
        watcher.start()
        producers.start()

        relayed = (lambda: published(engine), MOVED)
        views = (lambda: len(watcher.views), 3)
        pushed_got = (lambda: len(pushed.lines()), MOVED)
        polling_got = (lambda: len(polling.lines()), MOVED)

        def moving(*progress: Progress) -> None:
            wait_moving(parts, progress, WAIT)

        def crash(victims: list[ChildPart], *progress: Progress) -> None:
            """Once the victims are seen moving events (``moving(*progress)``), SIGKILL them
            at a random moment and start them again after a random pause."""
            moving(*progress)
            time.sleep(rng.uniform(0, 0.5))
            for victim in victims:
                victim.kill()
            time.sleep(rng.uniform(0.3, 1.5))
            for victim in victims:
                victim.start()

        # One part at a time, then all at once (as a crash of the machine, but the
        # database's, would), each while the chain moves events.
        crash([relay], relayed)
        crash([server], relayed)
        crash([live], views)
        crash([pushed], pushed_got)
        crash([polling], polling_got)
        crash(parts, relayed, views, pushed_got, polling_got)
        moving(relayed, views, pushed_got, polling_got)  # all of it flows again
        time.sleep(2.0)
        producers.stop()

        outcome = Outcome(engine)
        supervised_wait(parts, lambda: all_published(engine), WAIT, relay.tail)
        for consumer in (pushed, polling):
            supervised_wait(
                parts, lambda c=consumer: outcome.consumed_all(c.lines()), WAIT, consumer.tail
            )
        source = source_rows(engine)
        supervised_wait(parts, lambda: watcher.latest() == source, WAIT, live.tail)

        print(
            f"{len(outcome.events)} events committed "
            f"({producers.overtaken} transactions overtaken), "
            f"{len(producers.rolled_back)} rolled back; consumers got "
            + ", ".join(f"{len(c.lines())} ({c.name})" for c in (pushed, polling))
            + f" of {len(outcome.counted)}; the subscriber had {watcher.connections} connections"
        )
        # The producers committed out of sequence order within keys; rollbacks left nothing.
        assert producers.overtaken >= 10 and producers.rolled_back
        assert outcome.events.keys() == set(producers.committed)  # no rolled-back id in the log
        outcome.assert_stored(tmp_path / "events.db")
        for consumer in (pushed, polling):
            outcome.assert_consumed(consumer.name, consumer.lines())

        assert watcher.connections >= 2 and not watcher.errors  # it lived through the crash
        assert never_older(watcher.views)

        assert all(part.kills == 2 for part in parts)
        assert {p.name: p.exits for p in parts if p.exits and p is not live} == {}
    finally:
        stop_all([producers, watcher, *reversed(parts)], engine)
