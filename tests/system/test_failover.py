"""A redundant deployment keeps every event flowing while one process after another dies:
nothing lost, nothing duplicated in a store, nothing reordered per key.

The deployment (one ``tidings.yaml``, each part a child process as ``tidings run`` would
start it): two event servers ``a`` and ``b`` kept in sync by their Syncers (static peers),
each serving the same FTN18 stream; two relays on one PostgreSQL outbox, one active and one
standing by on the relay lease, their ``event_server`` target following the pair
(``addresses``); an intermediary following the pair, serving a SQL view over the table the
producers write to a subscriber that watches it throughout; a pushed and a polling reliable
consumer, each given both servers' stream URLs (in opposite orders, so that each server has a
consumer at the start).

While the producers commit out of sequence order (:mod:`tests.support.producers`), the test
SIGKILLs, each once the chain is seen moving: the server the relay publishes to (``a``), then,
with ``a`` back and caught up, the other (``b``); the intermediary; the active relay. A killed
server or intermediary is started again as a supervisor would; a killed relay is started
again as the new standby. It prints how long each failover took: from the kill until each
watched count grew again (informational; tests assert no timings).

Asserted against what was committed:

- both stores hold each committed event once, per key in sequence order, and nothing else;
- each consumer got every committed event of its stream at least once, as committed, per
  key in order of first delivery, and nothing else;
- the subscriber's view converges to the source rows and never went back to an older value;
- every outbox row is PUBLISHED; the standby relay did take over.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from bench.harness.processes import free_port, local_address, wait_for_port
from tests.support import chain_checks as chain
from tests.support.child_parts import (
    RESTART_PAUSE,
    ChildPart,
    Progress,
    supervised_wait,
    wait_moving,
)
from tests.support.producers import OutOfOrderProducers
from tests.support.view_watcher import ViewWatcher
from tidings.outbox.producer import Outbox
from tidings.pipeline.standby import relay_lease_state

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.postgres, pytest.mark.sockets]

SERVERS = {"a": 1, "b": 2}


def _pair(ports: dict[str, int]) -> dict[str, Any]:
    """Servers ``a`` and ``b``, each the other's static Syncer peer."""
    servers = {}
    for name, other in (("a", "b"), ("b", "a")):
        peer = {"server_id": SERVERS[other], "address": local_address(ports[f"syncer_{other}"])}
        servers[name] = chain.chain_server(
            SERVERS[name],
            f"events-{name}.db",
            local_address(ports[f"eventer_{name}"]),
            ports[f"stream_{name}"],
            syncer_server={"address": local_address(ports[f"syncer_{name}"])},
            syncer_peers=[peer],
        )
    return servers


def _active_relay(engine: Engine, relays: list[ChildPart]) -> ChildPart | None:
    """The relay that holds the relay lease, if one of ``relays`` does."""
    active = relay_lease_state(engine).active or ""
    return next((r for r in relays if r.proc and f":{r.proc.pid}:" in active), None)


def test_no_single_process_stops_the_flow(pg_url: str, tmp_path: Path) -> None:
    names = ["eventer_a", "eventer_b", "syncer_a", "syncer_b", "stream_a", "stream_b", "live"]
    ports = {name: free_port() for name in names}
    eventers = [local_address(ports["eventer_a"]), local_address(ports["eventer_b"])]
    path = chain.chain_file(
        tmp_path,
        pg_url,
        {"addresses": eventers},
        _pair(ports),
        chain.counter_view_intermediary(ports["live"], eventers),
    )
    engine = chain.chain_outbox(pg_url)
    streams = {s: f"http://127.0.0.1:{ports[f'stream_{s}']}/chain" for s in SERVERS}
    login = {"TIDINGS_STREAM_USER": chain.USER, "TIDINGS_STREAM_PASSWORD": chain.PASSWORD}
    server = {
        s: ChildPart(f"server-{s}", ["server", "-c", path, "--name", s], tmp_path) for s in SERVERS
    }
    relays = [ChildPart(f"relay-{n}", ["relay", "-c", path], tmp_path) for n in (1, 2)]
    live = ChildPart(
        "intermediary", ["intermediary", "serve", "-c", path, "--name", "live"], tmp_path
    )
    both = f"{streams['a']},{streams['b']}"
    pushed = ChildPart("pushed", ["consume", both, "Pushed"], tmp_path, login)
    back = f"{streams['b']},{streams['a']}"
    polling = ChildPart("polling", ["consume", back, "Polling", "--poll"], tmp_path, login)
    parts = [server["a"], server["b"], *relays, live, pushed, polling]
    watcher = ViewWatcher(f"ws://127.0.0.1:{ports['live']}/", chain.VIEW)
    producers = OutOfOrderProducers(Outbox(engine), chain.write_counted)
    rng = random.Random(29)
    #: Per failover, per watched count: seconds from the kill until it grew.
    took: dict[str, list[float]] = {}
    try:
        for name in SERVERS:
            server[name].start()
        for name in SERVERS:
            wait_for_port(ports[f"eventer_{name}"], 60, log=server[name].log)
        relays[0].start()
        supervised_wait(
            parts, lambda: _active_relay(engine, relays) is relays[0], chain.WAIT, relays[0].tail
        )
        for part in (relays[1], live, pushed, polling):
            part.start()
        wait_for_port(ports["live"], 60, log=live.log)
        watcher.start()
        producers.start()

        relayed = (lambda: chain.published(engine), chain.MOVED)
        views = (lambda: len(watcher.views), 3)
        pushed_got = (lambda: len(pushed.lines()), chain.MOVED)
        polling_got = (lambda: len(polling.lines()), chain.MOVED)
        everything = (relayed, views, pushed_got, polling_got)

        def moving(*progress: Progress) -> None:
            wait_moving(parts, progress, chain.WAIT)

        def failover(
            name: str, victim: ChildPart, *progress: Progress, restart: bool = False
        ) -> None:
            """Once the chain moves, SIGKILL ``victim`` at a random moment (``restart``: and
            start it again after :data:`RESTART_PAUSE`, as a supervisor would, where there is
            no standby to take over) and time how long until every ``progress`` count grows
            again (by one)."""
            moving(*everything)
            time.sleep(rng.uniform(0, 0.5))
            bases = [count() for count, _ in progress]
            victim.kill()
            killed = time.monotonic()
            if restart:
                time.sleep(RESTART_PAUSE)
                victim.start()
            grown: dict[int, float] = {}

            def all_grown() -> bool:
                for i, ((count, _), base) in enumerate(zip(progress, bases, strict=True)):
                    if i not in grown and count() > base:
                        grown[i] = time.monotonic() - killed
                return len(grown) == len(progress)

            supervised_wait(
                [p for p in parts if p is not victim],
                all_grown,
                chain.WAIT,
                lambda: "\n".join(p.tail() for p in parts),
            )
            took[name] = [grown[i] for i in range(len(progress))]

        failover("server a", server["a"], relayed, pushed_got)
        server["a"].start()
        moving(*everything)
        failover("server b", server["b"], relayed, polling_got)
        server["b"].start()
        failover("intermediary (restarted)", live, views, restart=True)
        active = _active_relay(engine, relays)
        assert active is not None, "no relay holds the lease"
        standby = next(r for r in relays if r is not active)
        lease_moved = (lambda: int(_active_relay(engine, relays) is standby), 1)
        failover("relay (lease taken, then publishing)", active, lease_moved, relayed)
        active.start()  # the new standby
        moving(*everything)  # all of it flows again
        time.sleep(2.0)
        producers.stop()

        outcome = chain.Outcome(engine)
        supervised_wait(parts, lambda: chain.all_published(engine), chain.WAIT, active.tail)
        for name in SERVERS:  # the Syncers bring each store up to all of it
            supervised_wait(
                parts,
                lambda n=name: (
                    len(chain.stored(tmp_path / f"events-{n}.db")) >= len(outcome.events)
                ),
                chain.WAIT,
                server[name].tail,
            )
        for consumer in (pushed, polling):
            supervised_wait(
                parts, lambda c=consumer: outcome.consumed_all(c.lines()), chain.WAIT, consumer.tail
            )
        source = chain.source_rows(engine)
        supervised_wait(parts, lambda: watcher.latest() == source, chain.WAIT, live.tail)

        print(
            f"{len(outcome.events)} events committed "
            f"({producers.overtaken} transactions overtaken); consumers got "
            + ", ".join(f"{len(c.lines())} ({c.name})" for c in (pushed, polling))
            + f" of {len(outcome.counted)}; failovers took "
            + "; ".join(
                f"{name} " + " / ".join(f"{t:.2f} s" for t in times) for name, times in took.items()
            )
        )
        assert producers.overtaken >= 10
        for name in SERVERS:
            outcome.assert_stored(tmp_path / f"events-{name}.db")
        for consumer in (pushed, polling):
            outcome.assert_consumed(consumer.name, consumer.lines())

        assert watcher.connections >= 2 and not watcher.errors  # it lived through the kill
        assert chain.never_older(watcher.views)
        assert all(r.kills <= 1 for r in relays) and sum(r.kills for r in relays) == 1
        assert {p.name: p.exits for p in parts if p.exits} == {}
    finally:
        chain.stop_all([producers, watcher, *reversed(parts)], engine)
