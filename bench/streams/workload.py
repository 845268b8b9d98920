"""What both parts of the streams benchmark share: where the FutoIn client and server are, the
stream's credentials and types, the rates offered, the sizes, and the backlogs written
straight into tidings' store and into FutoIn's tables."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg

from bench.harness.paths import REPO
from bench.harness.sizes import Scale, Sizes
from tidings.events.model import NewEvent, PayloadKind
from tidings.server.store import EventStore

FUTOIN_DIR = REPO / "tests" / "interop" / "futoin"
CLIENT_JS = FUTOIN_DIR / "client.js"
SERVER_JS = REPO / "bench" / "futoin" / "server.js"
FUTOIN_SQL = FUTOIN_DIR / "node_modules/futoin-eventstream/sql/active/postgresql/V18.1__Tables.sql"
USER, PASSWORD = "bench", "benchpass"
CREDS = f"{USER}:{PASSWORD}"
FTN18_TYPE, EVENT_TYPE = "BENCH", ("bench", "evt")
JS_STREAM, JS_SUBJECT = "BENCH", "bench.evt"
#: Events per second offered in the latency phases.
RATE = 1000
#: A lower rate at which the latency phases run once more (see the notes).
LOW_RATE = 300
#: How long the latency client waits for the last events after the load (missing events
#: count as this wait, a lower bound).
LATENCY_WAIT_S = 45
#: What a polling consumer waits after an empty poll in the latency phases.
POLL_IDLE_MS = 5
#: WebSocket connections of the Python addEvent generator of part (b) (one connection's
#: requests are served one at a time by tidings, see the notes).
PY_GEN_CONNS = 32
#: A client using at least this share of one core is taken as bounding the rate.
BOUND_SHARE = 0.85
RATE_MODES = ("reliable_push", "reliable_poll", "live")


@dataclass(frozen=True)
class StreamsSizes(Sizes):
    """The streams benchmark's sizes: backlogs, runs, seconds of load."""

    backlog: int  # (a) events drained per run (plus one marker event)
    runs: int  # runs per rate; the median is reported
    latency_s: float  # seconds of load per latency phase
    warmup_s: float  # first seconds of a latency load left out
    py_events: int  # (b) events drained per run
    py_runs: int


SCALE = Scale(
    full=StreamsSizes(20_000, 3, 10.0, 1.0, 100_000, 3),
    quick=StreamsSizes(10_000, 2, 3.0, 0.5, 20_000, 1),
)


def event_data(i: int) -> dict[str, Any]:
    return {"i": i, "order": f"ord-{i:08d}", "amount": i % 1000}


def fill_tidings(url: str, count: int) -> int:
    """A marker event then ``count`` events, written straight into tidings' store; the
    marker's position."""
    store = EventStore(url)
    try:

        def new(data: dict[str, Any]) -> NewEvent:
            return NewEvent(EVENT_TYPE, json.dumps(data).encode(), PayloadKind.JSON)

        [marker] = store.register([new({"marker": True})])
        for start in range(1, count + 1, 5000):
            store.register([new(event_data(i)) for i in range(start, min(start + 5000, count + 1))])
    finally:
        store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")
    return marker.position


FUTOIN_FILL = (
    "INSERT INTO evt_queue (type, data, ts) SELECT 'BENCH', json_build_object('i', g, 'order', "
    "'ord-' || lpad(g::text, 8, '0'), 'amount', mod(g, 1000)), now() AT TIME ZONE 'UTC' "
    "FROM generate_series(1, %s) g"
)


def fill_futoin(url: str, count: int) -> int:
    """FutoIn's tables, a marker event and ``count`` events (evt_queue rows); the marker's
    id."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FUTOIN_SQL.read_text())  # type: ignore[arg-type]
        row = conn.execute(
            "INSERT INTO evt_queue (type, data, ts) VALUES "
            "('BENCH', '{\"marker\": true}', now() AT TIME ZONE 'UTC') RETURNING id"
        ).fetchone()
        conn.execute(FUTOIN_FILL, (count,))  # type: ignore[arg-type]
        conn.execute("ANALYZE")
    assert row is not None
    return int(row[0])
