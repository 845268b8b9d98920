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
- no part ended on its own, but the intermediary when its event server was killed (it does
  not reconnect by itself: docs/guides/intermediaries.md).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from bench.harness.processes import free_port, local_address, wait_for_port
from tests.support.chain_checks import (
    DDL,
    VIEW,
    all_published,
    committed,
    never_older,
    out_of_order,
    published,
    source_rows,
    stored,
    write_counted,
)
from tests.support.child_parts import ChildPart, supervised_wait
from tests.support.producers import OutOfOrderProducers
from tests.support.view_watcher import ViewWatcher
from tidings.config.passwords import hash_password
from tidings.db import make_engine
from tidings.outbox.producer import Outbox

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.postgres, pytest.mark.sockets]

PREFIX = "chain"
USER, PASSWORD = "app", "pw"
#: The longest wait for one step (a part's progress, the chain catching up).
WAIT = 120.0
#: How far a part must move events after the test starts watching it before it is killed.
MOVED = 20


def _deployment(work: Path, pg: str, ports: dict[str, int]) -> Path:
    """The whole deployment in one ``tidings.yaml``."""
    eventer = local_address(ports["eventer"])
    data = {
        "database": {"url": pg},
        "outbox": {"originator": "chain-test"},
        "targets": {
            "server": {"kind": "event_server", "address": eventer, "type_prefix": [PREFIX]}
        },
        "routing": {"routes": {"Counted": ["server"], "rows.item": ["server"]}},
        "relay": {"checkpoint_dir": str(work / "checkpoint"), "trigger_interval": "100ms"},
        "servers": {
            "main": {
                "backend": {"module": "tidings.server.backends.sqlite", "db_path": "events.db"},
                "engine": {"server_id": 1},
                "eventer_server": {"address": eventer},
                "stream_users": {USER: {"password_hash": hash_password(PASSWORD)}},
                "streams": [
                    {
                        "name": "chain",
                        "port": ports["stream"],
                        "path": "/chain",
                        "types": {"COUNTED": [PREFIX, "Counted"]},
                    }
                ],
            }
        },
        "intermediaries": {
            "live": {
                "listen": f"127.0.0.1:{ports['live']}",
                "event_server": eventer,
                "row_type_prefix": [PREFIX],
                "tables": {
                    "item": {"columns": {"id": "integer", "n": "integer"}, "keyed_by": "id"}
                },
            }
        },
    }
    path = work / "tidings.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_every_committed_event_reaches_every_reader_across_crashes(
    pg_url: str, tmp_path: Path
) -> None:
    ports = {"eventer": free_port(), "stream": free_port(), "live": free_port()}
    path = str(_deployment(tmp_path, pg_url, ports))
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        for statement in DDL:
            conn.exec_driver_sql(statement)
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

        def moving(*progress: tuple[Callable[[], int], int]) -> None:
            """Wait until each ``progress`` count has grown by its amount from now."""
            bases = [count() for count, _ in progress]
            supervised_wait(
                parts,
                lambda: all(c() >= b + n for (c, n), b in zip(progress, bases, strict=True)),
                WAIT,
                lambda: "\n".join(p.tail() for p in parts),
            )

        def crash(victims: list[ChildPart], *progress: tuple[Callable[[], int], int]) -> None:
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

        committed_events = committed(engine)
        counted = {
            event_id: row for event_id, row in committed_events.items() if row[2] == "Counted"
        }
        supervised_wait(parts, lambda: all_published(engine), WAIT, relay.tail)
        for consumer in (pushed, polling):
            supervised_wait(
                parts,
                lambda c=consumer: counted.keys() <= {e["data"]["id"] for e in c.lines()},
                WAIT,
                consumer.tail,
            )
        source = source_rows(engine)
        supervised_wait(parts, lambda: watcher.latest() == source, WAIT, live.tail)

        print(
            f"{len(committed_events)} events committed "
            f"({producers.overtaken} transactions overtaken), "
            f"{len(producers.rolled_back)} rolled back; consumers got "
            + ", ".join(f"{len(c.lines())} ({c.name})" for c in (pushed, polling))
            + f" of {len(counted)}; the subscriber had {watcher.connections} connections"
        )
        # The producers committed out of sequence order within keys; rollbacks left nothing.
        assert producers.overtaken >= 10 and producers.rolled_back
        assert committed_events.keys() == set(producers.committed)  # no rolled-back id in the log
        order = {event_id: n for n, event_id in enumerate(committed_events)}  # sequence order
        key_of = {event_id: row[0] for event_id, row in committed_events.items()}

        stored_ids = stored(tmp_path / "events.db")
        assert sorted(stored_ids) == sorted(
            committed_events
        )  # each committed event once, nothing else
        assert out_of_order(stored_ids, order, key_of) is None

        for consumer in (pushed, polling):
            got = consumer.lines()
            assert {e["data"]["id"] for e in got} == counted.keys(), consumer.name
            assert all(e["data"] == counted[e["data"]["id"]][1] for e in got), consumer.name
            first = list(dict.fromkeys(e["data"]["id"] for e in got))
            assert out_of_order(first, order, key_of) is None, consumer.name

        assert watcher.connections >= 2 and not watcher.errors  # it lived through the crash
        assert never_older(watcher.views)

        assert all(part.kills == 2 for part in parts)
        assert {p.name: p.exits for p in parts if p.exits and p is not live} == {}
    finally:
        producers.stop()
        watcher.stop()
        for part in reversed(parts):
            part.stop()
        engine.dispose()
