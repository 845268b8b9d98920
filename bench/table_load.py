"""How long an intermediary takes to load a table: the newest row event per key against a
replay of the table's whole history.

Run ``.venv/bin/python -m bench.table_load [--quick]`` from the checkout. A ``tidings server``
in a subprocess (SQLite store) holds the history of one table: ``events`` row-change events
(``db/rows.t``, payload ``{"key", "row"}``) spread at random over ``keys`` keys, with some
deletions, registered in sessions of 1,000 (a relay's batch) into its store before it
starts. Each run loads the table into a fresh
:class:`~tidings.intermediary.views.eventviews.EventViews` (the intermediary's SQL-view state)
over the real Eventer wire, timed from the request to the table folded:

* ``latest``: ``Client.query_latest_by_key`` (the server picks the newest event per key in
  its store, in pages that fit the client's frame limit; what ``TidingsChain`` loads with);
* ``replay``: every row event of the type, oldest first (how tables were loaded before),
  read with ``Client.query_pages`` in pages of 10,000 events as any hat-event 0.8.5 client
  can (one query's reply of 1M events, ~125 MB, is over the client's 64 MiB frame limit),
  then folded whole.

Both must give the same table (checked: the view ``SELECT * FROM t`` is compared). Writes
``bench/results/table_load.json`` and ``bench/results/table_load.md``.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.machine import machine_info
from bench.harness.markdown import command, heading, table
from bench.harness.processes import ServerProcess, free_port
from bench.harness.progress import runtime_s, say
from bench.harness.report import write_report
from bench.harness.sizes import Scale, Sizes, arguments
from tidings.client import Client, QueryData, QueryType, StoredEvent, connect
from tidings.events.model import NewEvent, PayloadKind
from tidings.intermediary.views.eventviews import EventViews
from tidings.intermediary.views.messages import ChainBatch
from tidings.intermediary.views.sqlviews import Catalog, SqlLimits, SqlView
from tidings.server.store import EventStore

ROW_TYPE = ("db", "rows.t")
CATALOG = Catalog.from_mapping(
    {"t": {"id": "integer", "name": "text", "amount": "real", "version": "integer"}},
    keys={"t": "id"},
)
_TABLE = "SELECT * FROM t ORDER BY id"
#: Events registered per session while filling the store (the replay's pages re-read the
#: events of the timestamp they end at: a session's, so this bounds that overhead).
FILL_SESSION = 1_000


@dataclass(frozen=True)
class TableLoadSizes(Sizes):
    events: int
    keys: int
    runs: int


SCALE = Scale(
    full=TableLoadSizes(events=1_000_000, keys=10_000, runs=3),
    quick=TableLoadSizes(events=20_000, keys=200, runs=1),
)


class _Loaded:
    """The upstream of a fresh EventViews whose only batch is a table's load."""

    def __init__(self, rows: Sequence[StoredEvent]) -> None:
        self._batches = [ChainBatch(rows={"t": tuple(rows)})]

    async def update(self, patterns: Sequence[QueryType], tables: Mapping[str, QueryType]) -> None:
        pass

    async def loaded(self, tables: Iterable[str]) -> None:
        pass

    def take(self) -> list[ChainBatch]:
        batches, self._batches = self._batches, []
        return batches


def fill(store_path: Path, sizes: TableLoadSizes, seed: int = 1) -> None:
    """The table's history into a new store: random keys, one change in 20 a deletion."""
    rng = random.Random(seed)
    store = EventStore(f"sqlite:///{store_path}", server_id=1)
    try:
        for start in range(0, sizes.events, FILL_SESSION):
            session = []
            for version in range(start, min(start + FILL_SESSION, sizes.events)):
                key = rng.randrange(sizes.keys)
                payload: dict[str, Any] = (
                    {"key": key, "deleted": True}
                    if rng.random() < 0.05
                    else {"key": key, "row": {"id": key, "name": f"n{key}",
                                              "amount": rng.random(), "version": version}}
                )  # fmt: skip
                session.append(NewEvent(ROW_TYPE, json.dumps(payload).encode(), PayloadKind.JSON))
            store.register(session)
    finally:
        store.close()


async def load(client: Client, how: str) -> tuple[float, int, list[list[Any]]]:
    """One load: seconds from the request to the table folded, events received, the table."""
    started = time.perf_counter()
    if how == "latest":
        rows = await client.query_latest_by_key(ROW_TYPE)
    else:
        query = QueryData(event_types=(ROW_TYPE,), order="ascending")
        rows = [event async for page in client.query_pages(query) for event in page]
    views = EventViews(_Loaded(rows), CATALOG, limits=SqlLimits(max_rows=10_000_000))
    try:
        await views.subscribe("bench", "v", sql=_TABLE)
        views.step(0.0, 0)
        seconds = time.perf_counter() - started
        result = views.active.evaluate(SqlView.parse(_TABLE, CATALOG, views.limits))
    finally:
        views.close()
    return seconds, len(rows), [list(r.values()) for r in result.to_pylist()]


async def measure(address: str, runs: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    tables: dict[str, list[list[Any]]] = {}
    async with await connect(address, request_timeout=600) as client:
        for how in ("latest", "replay"):
            times = []
            for run in range(runs):
                seconds, received, tables[how] = await load(client, how)
                say(f"{how} run {run + 1}: {seconds:.2f} s, {received:,} events")
                times.append(seconds)
            figures[how] = {"median_s": round(statistics.median(times), 3),
                            "runs_s": [round(t, 3) for t in times],
                            "events_received": received}  # fmt: skip
    figures["same_table"] = tables["latest"] == tables["replay"]
    figures["rows"] = len(tables["latest"])
    return figures


def main() -> int:
    args = arguments("bench.table_load", __doc__, "20,000 events over 200 keys").parse_args()
    sizes = SCALE.pick(args.quick)
    work = Path(tempfile.mkdtemp(prefix="tidings-table-load-"))
    try:
        server = ServerProcess.tidings(work / "server", 1, {"eventer": free_port()})
        say(f"filling the store: {sizes.events:,} row events over {sizes.keys:,} keys")
        fill(work / "server" / "ev.db", sizes)
        server.start()
        try:
            figures = asyncio.run(measure(server.eventer, sizes.runs))
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"sizes": sizes.as_dict(), **figures, "machine": machine_info(spark=False)}
    write_report("table_load", result, markdown(result, args.quick, runtime_s()), args.results)
    return 0 if figures["same_table"] else 1


def markdown(r: dict[str, Any], quick: bool, runtime: float) -> str:
    sizes = r["sizes"]
    rows = [
        (how, f"{r[how]['median_s']} s", f"{r[how]['events_received']:,}")
        for how in ("latest", "replay")
    ]
    lines = [
        *heading(
            "Loading a table: newest row per key against a replay of its history",
            command("table_load", *(["--quick"] if quick else [])),
            r["machine"],
            runtime,
        ),
        f"{sizes['events']:,} historic row events over {sizes['keys']:,} keys "
        f"({r['rows']:,} rows live at the end); median of {sizes['runs']} runs, from the "
        f"request to the table folded; both loads give the same table: {r['same_table']}.",
        "",
        *table(("load", "time", "events received"), "lrr", rows),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
