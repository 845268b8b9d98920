"""The store's writer and SQLite's write lock held by another connection (a real file).

A write that must not wait (the server's event loop writes small groups so) is refused at
once with StoreBusy while another connection writes; one that may wait waits for the lock
and is stored. Neither changes what the next write does.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tidings.errors import StoreBusy
from tidings.events.model import json_event
from tidings.server.store import EventStore


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "events.db"


@pytest.fixture
def store(path: Path) -> Iterator[EventStore]:
    opened = EventStore(f"sqlite:///{path}")
    yield opened
    opened.close()


@contextmanager
def _other_writer(path: Path, seconds: float) -> Iterator[threading.Event]:
    """Another connection holding SQLite's write lock for ``seconds``; the event is set
    once it let go. A write that waited for the lock would be stored then, so a write that
    must not wait shows it did not by failing before that."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    released = threading.Event()

    def release() -> None:
        other.commit()
        released.set()

    timer = threading.Timer(seconds, release)
    timer.start()
    try:
        yield released
    finally:
        timer.join()
        other.close()


def _stored_seqs(store: EventStore) -> list[int]:
    return [
        json.loads(event.payload or b"null")["seq"]
        for event in store.read()
        if event.type[0] == "w"
    ]


def test_a_write_that_must_not_wait_is_refused_while_another_writes(
    store: EventStore, path: Path
) -> None:
    store.register_sessions([[json_event(("w", "a"), {"seq": 1})]])
    with _other_writer(path, 2.0) as released:
        with pytest.raises(StoreBusy, match="another writer holds the append lock"):
            store.register_sessions([[json_event(("w", "a"), {"seq": 2})]], wait=False)
        assert not released.is_set()  # refused at once, not after waiting
    # Nothing of the refused write is stored, and the next write goes through.
    store.register_sessions([[json_event(("w", "a"), {"seq": 3})]], wait=False)
    assert _stored_seqs(store) == [1, 3]


def test_a_write_that_may_wait_waits_for_the_lock_and_is_stored(
    store: EventStore, path: Path
) -> None:
    with _other_writer(path, 0.5) as released:
        store.register_sessions([[json_event(("w", "b"), {"seq": 1})]])
        assert released.is_set()  # stored only once the other writer let go
    assert _stored_seqs(store) == [1]
    # The wait was for that write only: a write that must not wait is refused again.
    with _other_writer(path, 2.0) as released:
        with pytest.raises(StoreBusy):
            store.register_sessions([[json_event(("w", "b"), {"seq": 2})]], wait=False)
        assert not released.is_set()
    assert _stored_seqs(store) == [1]
