"""What the server benchmark asks of every server, and how each answer is checked: the servers
it runs, its sizes, the event types its queries match, the measures with their goals against
hat, and the events it registers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import hat.event.common as hc

from bench.harness.sizes import Scale, Sizes

SERVERS = (
    "floor",
    "floor_store",
    "floor_store_periodic",
    "hat",
    "tidings",
    "tidings_periodic",
    "tidings_pg",
    "tidings_pg_periodic",
)

#: bench/server/floor.py: answers registers and stores nothing, so its rates are the ceiling
#: of any Python server driven by this client on this machine (register and notify steps).
FLOOR_KIND = "floor"
#: The floor storing as tidings' SQLite store does, with ``durability: commit`` and
#: ``periodic``: the ceiling of the tidings kinds with each durability (registers, notify).
STORE_FLOOR_KINDS = ("floor_store", "floor_store_periodic")


def is_floor(kind: str) -> bool:
    """Whether ``kind`` is one of the floor servers (registers and notify, no queries)."""
    return kind == FLOOR_KIND or kind in STORE_FLOOR_KINDS


FLOOR_STEPS = ("register batch", "register single", "register fire-and-forget", "notify latency")
#: The tidings servers, each compared with hat.
TIDINGS_KINDS = ("tidings", "tidings_periodic")
#: tidings on PostgreSQL, each compared with tidings on SQLite with the same durability:
#: the goal is "within 2 x" (at least half the rate, at most twice the latency).
PG_KINDS, PG_WITHIN = {"tidings_pg": "tidings", "tidings_pg_periodic": "tidings_periodic"}, 2.0
#: The hostile phase tests framing and budgets, which durability does not change: it runs
#: on hat and on the commit-durability tidings only.
HOSTILE_KINDS = ("hat", "tidings")


@dataclass(frozen=True)
class ServerSizes(Sizes):
    """The server benchmark's sizes: events per measure, queries per series."""

    register_events: int  # per register measure
    batch: int  # events per register_with_response in the batch measure and the query setup
    query_rounds: int  # events per query type
    queries: int  # timed runs of latest100, latest300 and the ordered query
    queries_3000: int  # timed runs of latest3000 (fewer if it exceeds the budget) ...
    min_queries_3000: int  # ... but at least this many
    query_budget_s: float
    notify_events: int
    hostile_events: int  # events the hostile phase's unbounded queries return
    warmup: int = 5  # untimed runs before each timed series


SCALE = Scale(
    full=ServerSizes(20_000, 100, 5, 200, 200, 50, 20.0, 1000, 200_000),
    quick=ServerSizes(2_000, 100, 2, 30, 15, 10, 5.0, 200, 20_000),
)

# Query types: ('bench', 'q', group, f't{i}'); the groups make the patterns below match exactly
# 100, 300 and 3,000 types.
GROUPS = {"g0": 100, "g1": 300, "g2": 2600}
LATEST = {
    "latest100": (("bench", "q", "g0", "*"), 100),
    "latest300": (("bench", "q", "g1", "*"), 300),
    "latest3000": (("bench", "q", "*"), 3000),
}
ORDERED_PATTERN = ("bench", "*")
ORDERED_RESULTS = 100
NOTIFY_PATTERN = ("bench", "n", "*")

# measure -> (unit, higher is better)
#: name: (unit, higher is better, goal as tidings ÷ hat) -- the goals: writes at
#: least 1.5 x hat's rate (2 x is the stretch), queries' p99 at most half of hat's, notify
#: latency no more than hat's.
MEASURES: dict[str, tuple[str, bool, float]] = {
    "register_batch_ev_s": ("ev/s", True, 1.5),
    "register_single_ev_s": ("ev/s", True, 1.5),
    "register_ff_ev_s": ("ev/s", True, 1.5),
    "latest100_p99_ms": ("ms", False, 0.5),
    "latest300_p99_ms": ("ms", False, 0.5),
    "latest3000_p99_ms": ("ms", False, 0.5),
    "ordered_p99_ms": ("ms", False, 0.5),
    "notify_p50_ms": ("ms", False, 1.0),
    "notify_p99_ms": ("ms", False, 1.0),
}
#: Reported beside the goals: the p50s, and the client's own CPU per query (the median):
#: a floor under any server's latency with this client, to hold against "0.5 x hat".
EXTRAS = (
    "latest100_p50_ms",
    "latest300_p50_ms",
    "latest3000_p50_ms",
    "ordered_p50_ms",
    "latest100_client_cpu_ms",
    "latest300_client_cpu_ms",
    "latest3000_client_cpu_ms",
    "ordered_client_cpu_ms",
)


class WrongAnswer(Exception):
    """A server answered a register or query incorrectly."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise WrongAnswer(message)


def json_payload(data: Any) -> hc.EventPayload:
    return hc.EventPayload(type=hc.EventPayloadType.JSON, data=data)


def reg_event(event_type: tuple[str, ...], data: Any) -> hc.RegisterEvent:
    return hc.RegisterEvent(
        event_type=event_type, source_timestamp=None, payload=json_payload(data)
    )


def ts_key(event: hc.Event) -> tuple[Any, ...]:
    return (event.timestamp.s, event.timestamp.us)


def check_registered(results: list[hc.Event | None], sent: list[hc.RegisterEvent]) -> None:
    check(len(results) == len(sent), f"register answered {len(results)} items for {len(sent)}")
    for got, want in zip(results, sent, strict=True):
        check(got is not None, "register answered a failure")
        assert got is not None
        check(
            tuple(got.event_type) == tuple(want.event_type)
            and got.payload is not None
            and got.payload.data == want.payload.data,  # type: ignore[union-attr]
            f"register answered {got} for {want}",
        )


def query_types() -> list[tuple[str, ...]]:
    return [("bench", "q", g, f"t{i}") for g, count in GROUPS.items() for i in range(count)]
