"""The live tail's sources: the outbox and a server's store, read after a position along
their own order, filtered by type; a source or pattern the file cannot have is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.processes import free_port
from tests.console.harness import Deployment, with_servers
from tidings.console.tail import open_tail
from tidings.db import make_engine
from tidings.errors import UsageError
from tidings.events.model import NewEvent, PayloadKind
from tidings.streams.consumers.admin import open_store


def test_the_outbox_tail_sends_what_is_committed_after_it_started(tmp_path: Path) -> None:
    deployed = Deployment(tmp_path, f"sqlite:///{tmp_path / 'outbox.db'}")
    deployed.emit([("orders.placed", "k", {"n": 0})])
    tail = open_tail(deployed.config, deployed.state.outbox.engine, "outbox", "orders.*")
    start = tail.newest()
    deployed.emit([("payments.made", "p", {"n": 1}), ("orders.placed", "k", {"n": 2})])
    position, items = tail.after(start)
    assert [(i.event_type, i.key) for i in items] == [("orders.placed", "k")]
    assert '"n":2' in items[0].payload.replace(" ", "")
    assert position == start + 2  # past the filtered-out one too
    assert tail.after(position) == (position, [])
    tail.close()
    deployed.close()


def test_a_server_tail_reads_its_store_with_a_hat_pattern(tmp_path: Path) -> None:
    config = with_servers(tmp_path, free_port(), free_port())
    engine = make_engine(config.database.url)
    tail = open_tail(config, engine, "server:main", "orders/*")
    start = tail.newest()
    store = open_store(config.servers["main"])
    try:
        store.register(
            [
                NewEvent(("orders", "placed"), b'{"n": 1}', PayloadKind.JSON),
                NewEvent(("payments", "made"), b"{}", PayloadKind.JSON),
            ]
        )
    finally:
        store.close()
    _, items = tail.after(start)
    assert [(i.event_type, i.payload) for i in items] == [("orders/placed", '{"n": 1}')]
    tail.close()
    engine.dispose()


@pytest.mark.parametrize(
    ("source", "pattern", "says"),
    [
        ("server:nowhere", "", "is not one of outbox, server:main, server:spare"),
        ("kafka", "", "is not one of"),
        ("server:main", "a/*/b", "'*' is allowed only as the last segment"),
    ],
)
def test_a_source_or_pattern_the_file_cannot_have_is_refused(
    tmp_path: Path, source: str, pattern: str, says: str
) -> None:
    config = with_servers(tmp_path, free_port(), free_port())
    with pytest.raises(UsageError, match=says):
        open_tail(config, make_engine(config.database.url), source, pattern)
