"""The console's reads of the outbox stay bounded whatever the log's size: each page's
SELECTs search an index (or walk the primary key in order and stop at the page's end),
never sort the whole log. Checked on SQLite's own plans (``docs/design/console.md`` shows
them, and PostgreSQL's, on a million rows)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tidings.outbox.incomplete as incomplete
from tests.console.harness import Deployment
from tests.support.query_plans import reads, sqlite_plans
from tidings.console.browse import ListQuery, event_page, page_of_events


@pytest.fixture
def deployed(tmp_path: Path) -> Deployment:
    deployed = Deployment(tmp_path, f"sqlite:///{tmp_path / 'outbox.db'}")
    deployed.emit([("orders.placed", f"k{i % 3}", {"n": i}) for i in range(30)])
    deployed.emit([("payments.made", "p", {"n": 1})])
    deployed.relay()  # published, and one UNROUTABLE
    deployed.emit([("orders.placed", f"k{i % 3}", {"n": i}) for i in range(30)])  # open
    return deployed


QUERIES = [
    ListQuery(),
    ListQuery(status="UNROUTABLE"),
    ListQuery(event_type="orders.*"),
    ListQuery(key="k1"),
    ListQuery(key="k1", status="PENDING"),
    ListQuery(key="k1", status="PARKED"),
    ListQuery(after="10"),
]


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: repr(q.params()))
def test_a_page_of_a_few_incomplete_events_reads_the_status_or_key_index(
    deployed: Deployment, query: ListQuery
) -> None:
    events = deployed.state.events
    plans = sqlite_plans(
        deployed.state.outbox.engine, lambda: page_of_events(events, query, 5, {"store"})
    )
    steps = [s for _, plan in plans for s in reads(plan) if " outbox_event" in s]
    assert steps and all(step.startswith("SEARCH") for step in steps), plans
    by_key = "SEARCH outbox_event USING INDEX idx_03_outbox_event (partition_key=?)"
    by_key_status = (
        "SEARCH outbox_event USING INDEX idx_04_outbox_event (partition_key=? AND status=?)"
    )
    if query.key and query.status == "PENDING":  # an open status of a key: (key, seq), open
        assert steps == [by_key]
    elif query.key and query.status:  # a set-aside status of a key: (key, status, seq)
        assert steps == [by_key_status]
    elif query.key:  # the open events, then the parked and the unroutable ones, by the key
        assert steps == [by_key, by_key_status, by_key_status]
    if query.key:  # each read of a key comes in seq order: no sort
        assert not any("TEMP B-TREE" in step for _, plan in plans for step in plan), plans
    deployed.close()


def test_a_page_of_many_incomplete_events_walks_the_log_in_order_without_a_sort(
    deployed: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(incomplete, "_SORT_AT_MOST", 0)  # as if the log held very many
    events = deployed.state.events
    plans = sqlite_plans(
        deployed.state.outbox.engine, lambda: page_of_events(events, ListQuery(), 5, {"store"})
    )
    (count, page) = [p for p in plans if "FROM outbox_event" in p[0]]
    assert reads(count[1]) == [
        "SEARCH outbox_event USING COVERING INDEX idx_01_outbox_event (status=?)"
    ]
    assert page[1] == ["SCAN outbox_event"]  # in rowid (seq) order, stopping at the page
    found, more = page_of_events(events, ListQuery(), 5, {"store"})
    assert [e.seq for e in found] == sorted(e.seq for e in found) and more
    deployed.close()


def test_an_event_page_reads_its_row_by_the_unique_event_id(deployed: Deployment) -> None:
    events = deployed.state.events
    event_id = events.find()[0].event_id
    plans = sqlite_plans(deployed.state.outbox.engine, lambda: event_page(events, event_id))
    steps = [s for _, plan in plans for s in reads(plan) if " outbox_event" in s]
    assert steps and all(step.startswith("SEARCH") and "event_id=?" in step for step in steps), (
        plans
    )
    deployed.close()
