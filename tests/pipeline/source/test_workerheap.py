"""Freezing a Spark Python worker's heap after its first task (no Spark needed: the
function is what the worker calls)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from tidings.pipeline.source import workerheap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


@pytest.fixture
def fresh_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A process that has not frozen yet; what the test froze is released after it."""
    monkeypatch.setattr(workerheap, "_frozen", False)
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_first_call_collects_garbage_then_freezes_what_lives(fresh_worker: None) -> None:
    garbage = _Node()
    dead = weakref.ref(garbage)
    del garbage
    kept = _Node()
    workerheap.freeze_heap()
    assert dead() is None, "garbage was frozen instead of collected"
    assert gc.get_freeze_count() > 0
    assert kept.me is kept


def test_later_calls_freeze_nothing_more(fresh_worker: None) -> None:
    workerheap.freeze_heap()
    frozen = gc.get_freeze_count()
    later = [_Node() for _ in range(1000)]
    workerheap.freeze_heap()
    assert gc.get_freeze_count() <= frozen  # (frozen objects freed meanwhile count down)
    dead = weakref.ref(later[0])
    del later
    gc.collect()
    assert dead() is None, "what a later task allocates must stay collectable"


def test_collection_is_paused_in_a_task_and_restored_after() -> None:
    assert gc.isenabled()
    garbage = _Node()
    dead = weakref.ref(garbage)
    with workerheap.collection_paused():
        assert not gc.isenabled()
        del garbage
        for _ in range(100_000):  # allocations that would set off collections
            _Node().me = None
        assert dead() is not None, "nothing collects a cycle while paused"
    assert gc.isenabled()
    gc.collect()
    assert dead() is None, "the cycle is collected once the collector runs again"


def test_a_caller_that_turned_collection_off_keeps_it_off() -> None:
    gc.disable()
    try:
        with workerheap.collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
