"""The re-send after a move covers what *other* target instances confirmed: other Spark
workers of the relay, or a relay process that died with its server, read from the outbox
log.

Each "worker" is its own :class:`EventServerTarget` instance run by the relay's publisher
(no Spark) over a real outbox log (SQLite file, PostgreSQL database), as a relay task runs
it. The servers are real ``tidings server`` processes that do not sync each other: the
worst case of a Syncer that had not copied the dead server's last events yet.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.support.helpers import statuses
from tests.support.publisher_helpers import logged_rows
from tidings.db import make_engine
from tidings.errors import TargetUnavailable
from tidings.outbox.confirmations import ConfirmationLog
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import ensure_schema
from tidings.pipeline.publishing.publisher import Publisher
from tidings.routing.table import merge_routes
from tidings.targets.kinds.event_server import EventServerTarget

from .test_event_server_group import KEYS, _event, _in_key_order, _payloads, _target

pytestmark = [pytest.mark.slow, pytest.mark.sockets]

ROUTES = merge_routes({"Created": ["group"]})  # the name _target gives the target
HALF = 16


def _emit(engine: Engine, numbers: range) -> None:
    with Outbox(engine).transaction() as tx:
        for n in numbers:
            tx.emit("Created", {"n": n}, partition_key=f"k{n % KEYS}")


def _worker(servers: list[str], engine: Engine | None) -> EventServerTarget:
    """A new target instance, as a new Spark worker builds it: nothing in memory. Its
    window (1 s) is shorter than the pause before the move: counted from now, it would
    have left the first half out."""
    target = _target(addresses=servers, failover_resend="1s")
    if engine is not None:
        target.attach_log(ConfirmationLog(engine))
    return target


def _relay_task(engine: Engine, servers: list[str], *, attached: bool = True) -> None:
    """What a relay task of a new worker does with the log's open rows: publish them (with
    the log attached, as the relay does, or not) and record outcomes; then the worker goes."""
    target = _worker(servers, engine if attached else None)
    try:
        Publisher(engine, ROUTES, {"group": target}.get, [0.0]).run(logged_rows(engine))
    finally:
        target.close()


def _numbers(server) -> list[int]:
    return [envelope["data"]["n"] for envelope in _payloads(server)]


@pytest.mark.parametrize(
    ("backend", "attached"),
    [
        ("sqlite", True),
        pytest.param("postgresql", True, marks=pytest.mark.postgres),
        ("sqlite", False),
    ],
)
def test_the_next_server_gets_what_another_worker_confirmed_on_the_dead_one_first(
    two_servers, tmp_path: Path, request, backend: str, attached: bool
) -> None:
    """Worker 1 confirms the first half on a and goes away; a is SIGKILLed; worker 2, a new
    instance, publishes the second half: b (never synced from a) holds the first half ahead
    of the second in every key, each event once. Without the log (``attached`` off) b lacks
    the first half: worker 2's memory is empty, the gap the log closes."""
    a, b = two_servers
    url = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    engine = make_engine(url or f"sqlite:///{tmp_path / 'app.db'}")
    ensure_schema(engine)
    _emit(engine, range(HALF))
    _relay_task(engine, [a.eventer, b.eventer], attached=attached)
    assert set(statuses(engine).values()) == {"PUBLISHED"}
    time.sleep(1.5)  # the relay that takes over starts later than the window is long
    a.kill()
    _emit(engine, range(HALF, 2 * HALF))
    _relay_task(engine, [a.eventer, b.eventer], attached=attached)
    assert set(statuses(engine).values()) == {"PUBLISHED"}
    on_b = _numbers(b)
    _in_key_order(on_b)
    assert sorted(on_b) == list(range(2 * HALF) if attached else range(HALF, 2 * HALF))
    a.start()
    assert sorted(_numbers(a)) == list(range(HALF))
    engine.dispose()


def test_an_outbox_log_that_cannot_be_read_holds_the_target(two_servers, tmp_path: Path) -> None:
    """A log the target cannot read (here a database without the outbox's tables): the
    target is unavailable, naming the log, and nothing is sent (better held than sent ahead
    of what the dead server may have taken with it)."""
    a, _ = two_servers
    target = _target(addresses=[a.eventer])
    target.attach_log(ConfirmationLog(make_engine(f"sqlite:///{tmp_path / 'empty.db'}")))
    try:
        with pytest.raises(TargetUnavailable) as raised:
            target.publish([_event(0)])
    finally:
        target.close()
    assert "cannot read the events confirmed before from the outbox log" in str(raised.value)
    assert "tidings_target_mark" in str(raised.value)
    assert _numbers(a) == []


def test_each_worker_that_moves_sends_the_log_again_and_the_server_keeps_one_copy(
    two_servers, tmp_path: Path
) -> None:
    """Two workers move to b in turn, each sending the log's events first: b stores each
    once, as the relay sent it to a (same payload, outbox id dedup), ahead of the later
    events."""
    a, b = two_servers
    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    ensure_schema(engine)
    _emit(engine, range(4))
    _relay_task(engine, [a.eventer, b.eventer])
    a.kill()
    for n in (100, 101):
        worker = _worker([a.eventer, b.eventer], engine)
        try:
            assert worker.publish([_event(n)]) == [None]
        finally:
            worker.close()
    stored = _payloads(b)
    assert [payload.get("data", payload)["n"] for payload in stored] == [0, 1, 2, 3, 100, 101]
    assert stored[:4] == [json.loads(item.event.payload) for item in logged_rows(engine)]
