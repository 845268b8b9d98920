"""An operator's fixes reach the targets through the running relay (real Spark, PostgreSQL).

A target that refuses everything (its fault file says ``down``: the one injected fault)
leaves the first event of each key FAILED and holds the rest. Parking the poison lets its
key flow on and resubmitting the other FAILED event sends it; an UNROUTABLE type re-driven
after its route was added is sent once, in key order; the unparked event is delivered once.
Every step is the relay's own carry-over of events below its offset (``relay --once``
again), no replay job.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import relay_config, statuses, store_events, store_target
from tidings.db import make_engine
from tidings.events.outbox import EventStatus
from tidings.outbox.incomplete import EventFilter, IncompleteEvents
from tidings.outbox.producer import Outbox
from tidings.pipeline.relay import run_relay
from tidings.routing.table import add_route, current_routes

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


def test_park_redrive_and_unpark_through_the_relay(spark, pg_url: str, tmp_path: Path) -> None:
    fault = tmp_path / "store.fault"
    config = relay_config(
        tmp_path,
        pg_url,
        targets={"store": store_target(tmp_path, fault_file=str(fault))},
        routes={"A": ["store"]},
        retry={"backoff": ["1ms"]},
    )
    engine = make_engine(config.database.url)
    outbox = Outbox(engine)
    plan = [("A", "k"), ("A", "k"), ("A", "k"), ("A", "other"), ("Later", "k2"), ("Later", "k2")]
    ids = []
    for n, (event_type, key) in enumerate(plan, start=1):
        with outbox.transaction() as tx:
            ids.append(tx.emit(event_type, {"n": n}, partition_key=key))

    fault.write_text("down")
    run_relay(spark, config, once=True)
    assert (
        list(statuses(engine).values()) == ["FAILED", "HELD", "HELD", "FAILED"] + ["UNROUTABLE"] * 2
    )

    def events() -> IncompleteEvents:
        return IncompleteEvents(engine, current_routes(config, engine).targets_for)

    assert events().park([ids[0]], "poison, see ticket 7") == [ids[0]]
    fault.write_text("")  # the target is back
    assert events().resubmit() == 1  # the other FAILED one: the relay stopped after its tries
    run_relay(spark, config, once=True)
    assert list(statuses(engine).values()) == ["PARKED"] + ["PUBLISHED"] * 3 + ["UNROUTABLE"] * 2

    add_route(engine, "Later", "store")
    unroutable = frozenset({EventStatus.UNROUTABLE})
    assert events().resubmit(EventFilter(statuses=unroutable)) == 2
    run_relay(spark, config, once=True)
    assert list(statuses(engine).values()) == ["PARKED"] + ["PUBLISHED"] * 5

    assert events().unpark([ids[0]]) == 1
    run_relay(spark, config, once=True)
    assert set(statuses(engine).values()) == {"PUBLISHED"}
    delivered = [e.outbox_event_id for e in store_events(config)]
    assert sorted(delivered) == sorted(ids)  # each exactly once
    assert [i for i in delivered if i in ids[1:3]] == ids[1:3]  # k flowed on in order
    assert [i for i in delivered if i in ids[4:]] == ids[4:]  # re-driven in key order
    assert delivered.index(ids[0]) > delivered.index(ids[2])  # the parked one came last
