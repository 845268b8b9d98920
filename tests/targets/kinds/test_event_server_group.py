"""The event_server target following a redundant group of event servers.

The servers are real ``tidings server`` processes on real sockets (and, for the Monitor
case, a real hat-monitor 0.7.2 Monitor Server); the one in use is SIGKILLed while the target
publishes. Timings are not asserted beyond a generous bound that catches a hang: the move
itself is designed to take well under 3 s.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hat.monitor.common import BlessingReq, BlessingRes, ComponentInfo

from bench.harness.processes import ServerProcess, free_port, local_address, wait_for_port
from tests.support.helpers import relay_config, statuses
from tests.support.server_helpers import server_payloads
from tests.support.waiting import wait_until
from tidings.config import load_config
from tidings.db import make_engine
from tidings.errors import ConfigError, TargetUnavailable
from tidings.events.outbox import OutboxEvent
from tidings.outbox.producer import Outbox
from tidings.pipeline.relay_query import start_relay
from tidings.server.store.schema import events_table
from tidings.targets import registry  # noqa: F401 - enters the target kinds' models
from tidings.targets.kinds.event_server import EventServerTarget
from tidings.targets.kinds.event_server_config import EventServerTargetConfig
from tidings.targets.kinds.server_group import blessed_addresses

pytestmark = pytest.mark.sockets

KEYS = 4
#: A bound on one failover that only a hang exceeds (the design bound is 3 s).
HANG_S = 15


def _event(n: int) -> OutboxEvent:
    return OutboxEvent(
        seq=n + 1,
        event_id=f"evt-{n}",
        event_type="Created",
        payload=json.dumps({"n": n}),
        logged_at=datetime(2026, 1, 1, tzinfo=UTC),
        partition_key=f"k{n % KEYS}",
    )


def _numbers(server: ServerProcess) -> list[int]:
    """The ``n`` of every event the target published that the server holds, in log order."""
    return [payload["n"] for payload in _payloads(server)]


def _payloads(server: ServerProcess) -> list[dict]:
    """The payloads of the events under type ``t`` a server holds, in its log order."""
    return server_payloads(server.eventer)


def _in_key_order(numbers: list[int]) -> None:
    assert len(numbers) == len(set(numbers)), f"an event is stored twice: {numbers}"
    for key in range(KEYS):
        of_key = [n for n in numbers if n % KEYS == key]
        assert of_key == sorted(of_key), f"key k{key} out of order: {of_key}"


def _target(**where: object) -> EventServerTarget:
    config = EventServerTargetConfig(kind="event_server", type_prefix=["t"], timeout="3s", **where)
    return EventServerTarget("group", config)


# --- configuration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"addresses": []}, "addresses needs at least one address"),
        ({"addresses": ["tcp+sbs://h:1", "http://h:2"]}, "scheme must be tcp+sbs"),
        ({"addresses": ["tcp+sbs://h:1", "tcp+sbs://h:1"]}, "lists an address twice"),
        (
            {"address": "tcp+sbs://h:1", "addresses": ["tcp+sbs://h:2"]},
            "not address and addresses",
        ),
        (
            {
                "addresses": ["tcp+sbs://h:2"],
                "monitor": {"monitor_address": "tcp+sbs://m:1", "server_group": "event"},
            },
            "not addresses and monitor",
        ),
        ({"monitor": {"monitor_address": "tcp+sbs://m:1"}}, "server_group"),
        ({"monitor": {"monitor_address": "m:1", "server_group": "e"}}, "monitor.monitor_address"),
    ],
)
def test_a_bad_server_group_is_a_config_error_naming_it(entry: dict, message: str) -> None:
    _refused_naming(entry, message)


def _refused_naming(entry: dict, message: str) -> None:
    """An event_server target ``remote`` with ``entry`` is a ConfigError naming the target and
    saying ``message``."""
    with pytest.raises(ConfigError) as raised:
        load_config({"targets": {"remote": {"kind": "event_server", **entry}}})
    assert "targets.remote" in str(raised.value) and message in str(raised.value)


def test_one_address_is_still_a_group_of_one_and_configs_round_trip() -> None:
    one = load_config({"targets": {"r": {"kind": "event_server", "address": "tcp+sbs://h:1"}}})
    default = load_config({"targets": {"r": {"kind": "event_server"}}})
    many = load_config(
        {
            "targets": {
                "r": {"kind": "event_server", "addresses": ["tcp+sbs://b:2", "tcp+sbs://a:1"]}
            }
        }
    )
    monitored = load_config(
        {
            "targets": {
                "r": {
                    "kind": "event_server",
                    "monitor": {"monitor_address": "tcp+sbs://m:1", "server_group": "event"},
                }
            }
        }
    )
    assert one.targets["r"].server_addresses == ["tcp+sbs://h:1"]  # type: ignore[attr-defined]
    assert default.targets["r"].server_addresses == ["tcp+sbs://127.0.0.1:23012"]  # type: ignore[attr-defined]
    assert many.targets["r"].server_addresses == ["tcp+sbs://b:2", "tcp+sbs://a:1"]  # type: ignore[attr-defined]
    assert monitored.targets["r"].server_addresses == []  # type: ignore[attr-defined]
    for config in (one, default, many, monitored):  # the relay hands it to Spark as JSON
        assert type(config).model_validate_json(config.model_dump_json()) == config


def _info(cid: int, group: str, address: object, req: int | None, res: int | None):
    return ComponentInfo(
        cid=cid,
        mid=0,
        name=f"c{cid}",
        group=group,
        data={"server_id": cid, "eventer_server_address": address},
        rank=1,
        blessing_req=BlessingReq(token=req, timestamp=None if req is None else 1.0),
        blessing_res=BlessingRes(token=res, ready=True),
    )


def test_the_monitor_names_the_blessed_servers_of_the_group_as_hat_event_does() -> None:
    components = [
        _info(1, "event", "tcp+sbs://a:1", None, None),  # not blessed
        _info(2, "event", "tcp+sbs://b:2", 7, None),  # blessed, not yet accepted
        _info(3, "event", "tcp+sbs://c:3", 8, 8),  # blessed and serving
        _info(4, "other", "tcp+sbs://d:4", 9, 9),  # another group
        _info(5, "event", None, 10, 10),  # no Eventer address
        _info(6, "event", "tcp+sbs://f:6", 11, 11),
    ]
    assert blessed_addresses(components, "event") == ["tcp+sbs://c:3", "tcp+sbs://f:6"]


def test_an_unreachable_monitor_makes_the_target_unavailable_naming_it() -> None:
    """A port where nothing listens stands for a Monitor Server that is down."""
    where = local_address(free_port())
    target = _target(
        monitor={"monitor_address": where, "server_group": "event"}, failover_wait="300ms"
    )
    try:
        with pytest.raises(TargetUnavailable) as raised:
            target.publish([_event(0)])
    finally:
        target.close()
    assert f"group 'event' of the Monitor at {where}" in str(raised.value)
    assert f"Monitor {where}: " in str(raised.value)


# --- a static pair -----------------------------------------------------------------------


class Publisher:
    """Publishes numbered events in calls of ``size``, each call again until every event
    of it is confirmed (as the relay does: an unavailable target holds them); the events
    of a key go in order, and each is counted once as confirmed."""

    def __init__(self, target: EventServerTarget, size: int = 8) -> None:
        self.target = target
        self.size = size
        self.next = 0
        self.confirmed: list[int] = []
        self.longest = 0.0  # the longest a call took to be confirmed, retries included
        self.stop = threading.Event()
        self.errors: list[str] = []

    def publish(self) -> None:
        numbers = list(range(self.next, self.next + self.size))
        self.next += self.size
        started = time.monotonic()
        while True:
            try:
                results = self.target.publish([_event(n) for n in numbers])
            except TargetUnavailable:
                time.sleep(0.2)
                continue
            if any(results):
                self.errors.append(str(results))
                return
            break
        self.longest = max(self.longest, time.monotonic() - started)
        self.confirmed.extend(numbers)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.publish()
        except Exception as exc:  # the test reports it, not the thread
            self.errors.append(f"{type(exc).__name__}: {exc}")


@pytest.mark.slow
def test_the_target_moves_to_the_next_address_when_its_server_is_killed(two_servers) -> None:
    a, b = two_servers
    target = _target(addresses=[a.eventer, b.eventer])
    publisher = Publisher(target)
    thread = threading.Thread(target=publisher.run)
    try:
        thread.start()
        wait_until(
            lambda: len(publisher.confirmed) >= 40, 30, explain=lambda: str(publisher.errors)
        )
        a.kill()  # SIGKILL, while calls go on
        sent_at_kill = publisher.next
        wait_until(
            lambda: len(publisher.confirmed) >= sent_at_kill + 40,
            HANG_S,
            explain=lambda: str(publisher.errors),
        )
        publisher.stop.set()
        thread.join(HANG_S)
    finally:
        publisher.stop.set()
        target.close()
    assert not publisher.errors
    assert publisher.longest < HANG_S
    confirmed = publisher.confirmed
    assert sorted(confirmed) == list(range(publisher.next)), "an event confirmed twice or never"
    on_b = _numbers(b)
    _in_key_order(on_b)  # each once, each key in order
    # b, which a never synced to, got every event a confirmed (all within failover_resend)
    # again, ahead of the later ones of their keys.
    assert set(on_b) == set(range(publisher.next))
    a.start()
    on_a = _numbers(a)
    _in_key_order(on_a)
    assert on_a and set(on_a) < set(on_b)


@pytest.mark.slow
def test_no_server_holds_the_events_and_the_first_address_is_preferred_again(
    two_servers,
) -> None:
    a, b = two_servers
    target = _target(addresses=[a.eventer, b.eventer], failover_wait="500ms")
    try:
        assert target.publish([_event(n) for n in range(4)]) == [None] * 4
        a.kill()
        b.kill()
        with pytest.raises(TargetUnavailable) as raised:
            target.publish([_event(n) for n in range(4, 8)])
        assert a.eventer in str(raised.value) and b.eventer in str(raised.value)
        b.start()
        assert target.publish([_event(n) for n in range(4, 8)]) == [None] * 4
        a.start()  # b is in use until it is lost; then a, first in the list, again
        assert target.publish([_event(n) for n in range(8, 12)]) == [None] * 4
        b.kill()
        assert target.publish([_event(n) for n in range(12, 16)]) == [None] * 4
    finally:
        target.close()
    # Each new connection first got the events confirmed before (failover_resend), in order.
    assert _numbers(a) == list(range(16))
    b.start()
    assert _numbers(b) == list(range(12))


# --- a Monitor group with BLESS_ONE ------------------------------------------------------


def _eventer_open(server: ServerProcess) -> bool:
    try:
        wait_for_port(server.port, 0.2)
    except RuntimeError:
        return False
    return True


@pytest.mark.slow
def test_with_bless_one_the_target_follows_the_blessed_server(tmp_path: Path) -> None:
    """Two synced tidings servers of one BLESS_ONE group: the target publishes to the one
    blessed; killed, the Monitor blesses the other, and the target follows it there, where
    every event is found once, in key order."""
    monitor = ServerProcess.hat_monitor(tmp_path / "monitor", free_port(), "BLESS_ONE")
    monitor.start(20)
    processes = [monitor]
    target = None
    try:
        member = {"group": "event", "monitor_address": local_address(monitor.ports["monitor"])}
        for server_id, name in ((1, "a"), (2, "b")):
            ports = {"eventer": free_port(), "syncer": free_port()}
            monitored = {"name": name, **member}
            processes.append(
                ServerProcess.tidings(
                    tmp_path / name, server_id, ports, token="t", monitor=monitored
                )
            )
            processes[-1].start(30)
        a, b = processes[1:]
        wait_until(lambda: sum(map(_eventer_open, (a, b))) == 1, 30)
        active, standby = (a, b) if _eventer_open(a) else (b, a)
        wait_until(lambda: "is synced" in active.log_path.read_text(), 30, explain=active.log_tail)
        # The standby got every event through the Syncer, which carries their outbox ids:
        # the window a sent again after the move (the default 10 s, all 40) is not stored twice.
        target = _target(
            monitor={"monitor_address": member["monitor_address"], "server_group": "event"}
        )
        publisher = Publisher(target)
        for _ in range(5):
            publisher.publish()
        assert _numbers(active) == list(range(40))
        wait_until(lambda: _held_in_file(standby) == list(range(40)), 30)
        active.kill()
        for _ in range(5):
            publisher.publish()
        assert not publisher.errors
        assert publisher.longest < HANG_S
        assert "monitor blessed this server" in standby.log_path.read_text()
        on_standby = _numbers(standby)
        _in_key_order(on_standby)
        assert on_standby == list(range(80))
    finally:
        if target is not None:
            target.close()
        for process in reversed(processes):
            process.stop()


def _held_in_file(server: ServerProcess) -> list[int]:
    """The ``n`` of every relayed event a server holds, read from its SQLite file: a
    ``BLESS_ONE`` standby keeps its Eventer closed."""
    with contextlib.closing(sqlite3.connect(server.workdir / "ev.db")) as db:
        rows = db.execute(f"select payload from {events_table.name}").fetchall()
    payloads = [json.loads(payload) for (payload,) in rows if payload]
    return sorted(p["n"] for p in payloads if isinstance(p, dict) and "n" in p)


@pytest.mark.slow
@pytest.mark.spark
def test_the_relay_publishes_to_the_next_server_after_a_kill(spark, two_servers, tmp_path) -> None:
    """The Spark relay with a two-address target: a run into a, a SIGKILL, and the next run
    delivers into b; every outbox row ends PUBLISHED, each server's events in key order.

    The second run's task runs in the Python worker Spark reused, where the target built by
    the first run still holds what a confirmed: b gets that again first."""
    a, b = two_servers
    targets = {
        "pair": {
            "kind": "event_server",
            "addresses": [a.eventer, b.eventer],
            "type_prefix": ["t"],
            "failover_resend": "50s",  # Spark's idle workers live a minute
        }
    }
    config = relay_config(tmp_path, targets=targets, routes={"Created": ["pair"]})
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)

    def emit(numbers: range) -> None:
        for n in numbers:
            with outbox.transaction() as tx:
                tx.emit("Created", {"n": n}, partition_key=f"k{n % KEYS}")

    emit(range(0, 40))
    start_relay(spark, config, available_now=True).awaitTermination()
    a.kill()
    emit(range(40, 80))
    start_relay(spark, config, available_now=True).awaitTermination()
    assert set(statuses(engine).values()) == {"PUBLISHED"}
    on_b = [envelope["data"]["n"] for envelope in _payloads(b)]
    _in_key_order(on_b)
    assert set(on_b) == set(range(80))
    a.start()
    on_a = [envelope["data"]["n"] for envelope in _payloads(a)]
    _in_key_order(on_a)
    assert set(on_a) == set(range(40))
