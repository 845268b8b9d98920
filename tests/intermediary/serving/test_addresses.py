"""The bookkeeping of the limits per client address (issue 30): seats per address, and the
failed-login throttle's window, block and memory bound, driven by a clock the test steps
(a parameter of the throttle, not a fake part: the real classes run). The same limits over
real sockets: ``test_metrics``."""

from __future__ import annotations

from tidings.intermediary.serving.addresses import AddressSlots, LoginThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_seats_are_per_address_and_given_back() -> None:
    slots = AddressSlots(2)
    assert slots.take("a") and slots.take("a") and not slots.take("a")
    assert slots.take("b") and slots.take(None)
    slots.give_back("a")
    assert slots.take("a") and slots.held("a") == 2
    for _ in range(2):
        slots.give_back("a")
    assert slots.held("a") == 0 and "at most 2" in slots.refusal("a")
    unbounded = AddressSlots(None)
    assert all(unbounded.take("a") for _ in range(1000))


def test_failures_outside_the_window_do_not_block_and_a_block_ends() -> None:
    clock = Clock()
    throttle = LoginThrottle(3, 60.0, 300.0, clock=clock)
    for _ in range(2):
        throttle.failed("a")
    clock.now += 61  # those two are out of the window now
    throttle.failed("a")
    assert throttle.blocked("a") is None and throttle.blocks == 0
    throttle.failed("a")
    throttle.failed("a")
    left = throttle.blocked("a")
    assert left is not None and 0 < left <= 300 and throttle.blocks == 1
    assert throttle.blocked("b") is None  # another address is not touched
    clock.now += 301
    assert throttle.blocked("a") is None
    throttle.failed("a")  # a fresh start: one failure is no block
    assert throttle.blocked("a") is None


def test_many_addresses_make_it_forget_never_grow() -> None:
    clock = Clock()
    throttle = LoginThrottle(2, 60.0, 60.0, clock=clock, max_tracked=100)
    throttle.failed("blocked")
    throttle.failed("blocked")
    for n in range(1000):
        throttle.failed(f"10.0.{n // 256}.{n % 256}")
        assert throttle.tracked() <= 100
