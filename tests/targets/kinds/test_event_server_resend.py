"""The event_server target sending again, after a move, what its lost server confirmed.

The servers are real ``tidings server`` processes on real sockets that do not sync each
other: the second server gets only what the target sends it, which is the worst case of a
Syncer that had not copied the dead server's last events yet. The window itself is tested
on its own with a clock the test turns.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bench.harness.processes import ServerProcess, free_port
from tidings.config import load_config
from tidings.errors import TargetUnavailable
from tidings.events.model import NewEvent
from tidings.events.outbox import OutboxEvent
from tidings.targets import registry  # noqa: F401 - enters the target kinds' models
from tidings.targets.kinds.resend_window import Confirmed, ResendWindow, resend_list, weight

from .test_event_server_group import _event, _in_key_order, _numbers, _refused_naming, _target


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _new(n: int, size: int = 0) -> Confirmed:
    """Event ``n`` as confirmed: its seq (n + 1, as ``_event``'s) and its server event."""
    return n + 1, NewEvent(type=("t", "Created"), payload=b"x" * size, outbox_event_id=f"evt-{n}")


def _padded(n: int) -> OutboxEvent:
    """Event ``n`` with ~300 bytes of payload: alone under 1 KiB, 24 of them well over."""
    event = _event(n)
    return replace(event, payload=json.dumps({"n": n, "pad": "x" * 300}))


def _ids(window: ResendWindow | list[Confirmed]) -> list[str | None]:
    entries = window.events() if isinstance(window, ResendWindow) else window
    return [event.outbox_event_id for _, event in entries]


# --- the window --------------------------------------------------------------------------


def test_the_window_keeps_confirmed_events_in_order_until_they_are_too_old() -> None:
    clock = Clock()
    window = ResendWindow(10.0, 100, 2**20, clock)
    window.add([_new(0), _new(1)])
    clock.now += 6
    window.add([_new(2)])
    assert _ids(window) == ["evt-0", "evt-1", "evt-2"]
    clock.now += 5  # 11 s after the first two, 5 s after the third
    assert _ids(window) == ["evt-2"]
    clock.now += 6
    assert _ids(window) == [] and len(window) == 0


def test_sent_again_to_a_new_server_the_events_age_from_then() -> None:
    clock = Clock()
    window = ResendWindow(10.0, 100, 2**20, clock)
    window.add([_new(0)])
    clock.now += 9
    window.renew(window.events())  # the new server confirmed it now: its own sync starts now
    clock.now += 9
    assert _ids(window) == ["evt-0"]


def test_the_oldest_events_leave_first_past_the_count_or_the_bytes() -> None:
    clock = Clock()
    by_count = ResendWindow(10.0, 3, 2**20, clock)
    by_count.add([_new(n) for n in range(5)])
    assert _ids(by_count) == ["evt-2", "evt-3", "evt-4"]

    size = weight(_new(0, 1000)[1])
    by_bytes = ResendWindow(10.0, 100, 2 * size + 10, clock)
    by_bytes.add([_new(0, 1000), _new(1, 1000)])
    by_bytes.add([_new(2, 1000)])
    assert _ids(by_bytes) == ["evt-1", "evt-2"]


def test_what_the_log_recorded_and_the_window_remembers_go_once_each_in_log_order() -> None:
    """The window may hold an event sent again at an earlier move (seq 2) that the log's
    window has left, while the log holds later events another process confirmed since (seq
    3, 5): they go in log order, each once (seq 3 is in both)."""
    merged = resend_list([_new(2), _new(4)], [_new(1), _new(2), _new(0)], 100, 2**20)
    assert _ids(merged) == ["evt-0", "evt-1", "evt-2", "evt-4"]


def test_past_its_bounds_the_resend_list_leaves_out_the_oldest_in_log_order() -> None:
    """Per key (n % 4 here) only its latest events stay: never a later one without the
    ones between."""
    recorded = [_new(n) for n in range(0, 10, 2)]
    remembered = [_new(n) for n in range(1, 10, 2)]
    assert _ids(resend_list(recorded, remembered, 3, 2**20)) == ["evt-7", "evt-8", "evt-9"]
    size = weight(_new(0, 100)[1])
    big = [_new(n, 100) for n in range(6)]
    assert _ids(resend_list(big, [], 100, 2 * size + 1)) == ["evt-4", "evt-5"]


def test_a_window_of_zero_keeps_nothing() -> None:
    window = ResendWindow(0.0, 100, 2**20, Clock())
    window.add([_new(0)])
    assert _ids(window) == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"failover_resend": "-1s"}, "failover_resend"),
        ({"failover_resend": "2h"}, "at most 1h"),
        ({"failover_resend_events": 0}, "failover_resend_events"),
        ({"failover_resend_bytes": 10}, "failover_resend_bytes"),
        ({"failover_resend_bytes": 2**31}, "failover_resend_bytes"),
    ],
)
def test_a_bad_resend_window_is_a_config_error_naming_it(entry: dict, message: str) -> None:
    _refused_naming(entry, message)


def test_the_resend_window_defaults_and_a_zero_window_validate() -> None:
    config = load_config({"targets": {"r": {"kind": "event_server", "failover_resend": "0s"}}})
    assert config.targets["r"].failover_resend.total_seconds() == 0  # type: ignore[attr-defined]
    default = load_config({"targets": {"r": {"kind": "event_server"}}}).targets["r"]
    assert default.failover_resend.total_seconds() == 10  # type: ignore[attr-defined]
    assert default.failover_resend_events == 10_000  # type: ignore[attr-defined]
    assert default.failover_resend_bytes == 16 * 1024 * 1024  # type: ignore[attr-defined]


# --- a pair that does not sync -----------------------------------------------------------


def _publish(target, numbers: range) -> None:
    assert target.publish([_event(n) for n in numbers]) == [None] * len(numbers)


@pytest.mark.slow
@pytest.mark.sockets
@pytest.mark.parametrize("resend", ["10s", "0s"])
def test_after_a_kill_the_next_server_gets_what_the_dead_one_confirmed_first(
    two_servers, resend: str
) -> None:
    """a confirmed 0..39 and is SIGKILLed; 40..79 go to b, which never heard of a. With the
    window, b holds all 80 once each, a's ahead of the later events of every key; without
    it (``0s``), b lacks a's: the gap the window closes."""
    a, b = two_servers
    target = _target(addresses=[a.eventer, b.eventer], failover_resend=resend)
    try:
        for start in range(0, 40, 8):
            _publish(target, range(start, start + 8))
        a.kill()
        for start in range(40, 80, 8):
            _publish(target, range(start, start + 8))
    finally:
        target.close()
    on_b = _numbers(b)
    _in_key_order(on_b)
    if resend == "0s":
        assert on_b == list(range(40, 80))
    else:
        assert on_b == list(range(80))  # a's window first, in order, then the later calls
    a.start()
    assert _numbers(a) == list(range(40))


@pytest.mark.slow
@pytest.mark.sockets
def test_only_events_confirmed_within_the_window_are_sent_again(two_servers) -> None:
    """Events older than ``failover_resend`` when the move happens are not sent again: a
    server that lost them waits for the dead one's Syncer (the case the window leaves out)."""
    a, b = two_servers
    target = _target(addresses=[a.eventer, b.eventer], failover_resend="500ms")
    try:
        _publish(target, range(0, 8))
        time.sleep(1.0)
        _publish(target, range(8, 16))
        a.kill()
        _publish(target, range(16, 24))
    finally:
        target.close()
    assert _numbers(b) == list(range(8, 24))


@pytest.mark.slow
@pytest.mark.sockets
def test_a_window_the_next_server_will_not_take_holds_the_target_until_it_ages(
    tmp_path: Path,
) -> None:
    """b closes the connection on a frame over 1 KiB (a real server limit, standing for a
    re-send that cannot get through): the window of a's 24 events, one request of ~4 KiB,
    never reaches it, while single events do. The target is unavailable (the relay would
    hold the call, uncharged), nothing of the call is stored, and once the window has aged
    the call goes to b."""
    a = ServerProcess.tidings(tmp_path / "a", 1, {"eventer": free_port()})
    b = ServerProcess.tidings(
        tmp_path / "b", 2, {"eventer": free_port()}, eventer={"max_frame_bytes": 1024}
    )
    target = _target(addresses=[a.eventer, b.eventer], failover_resend="2s")
    try:
        a.start()
        b.start()
        for n in range(24):
            assert target.publish([_padded(n)]) == [None]
        a.kill()
        with pytest.raises(TargetUnavailable) as raised:
            target.publish([_padded(24)])
        assert "while sending the events confirmed before" in str(raised.value)
        assert _numbers(b) == []
        time.sleep(2.2)
        assert target.publish([_padded(24)]) == [None]
        assert _numbers(b) == [24]
    finally:
        target.close()
        a.stop()
        b.stop()
