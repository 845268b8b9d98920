"""Benchmark of tidings' event server against hat-event 0.8.5's own server (lmdb backend).

Run ``.venv/bin/python bench/server.py [--quick] [--only KIND]`` from the repository. tidings
runs four times: with ``durability: commit`` (a registration is answered once committed),
with ``durability: periodic`` (answered once written, committed at most ``flush_period`` =
1 s later, as hat's lmdb backend does), and both on PostgreSQL; ``floor`` (bench/floor_server.py)
answers registers and stores nothing, the ceiling of any Python server here. Each server runs
as a subprocess in a fresh temporary directory on a free port and is driven by the same
client, hat-event 0.8.5's ``hat.event.eventer`` (asyncio, in this process), with the same
workload:

1. register throughput: batches of 100 with ``register_with_response``, single events with
   ``register_with_response`` one at a time, and fire-and-forget ``register`` of single
   events until all are stored;
2. latest-by-type queries (``unique_type=True``) matching 100, 300 and 3,000 event types,
   and a time-ordered query of the newest 100 events: p50 and p99;
3. notify latency: register one event (one at a time) until a second, subscribed client
   receives its notify: p50 and p99;
4. hostile (``bench/server_hostile.py``, ``--hostile on|off|only``): issue 8's hostile and
   careless clients, one at a time, with a bystander client in its own process: its worst
   round trip and the server's peak RSS per row.

Every answer is checked (counts, types, newest values, order); a wrong answer fails the run.
Writes ``bench/results/server.json`` and ``bench/results/server.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import hat.event.common as hc
import psutil
from common import (
    LOADED_SHARE,
    MachineCpu,
    code_version,
    cpu_seconds,
    cpu_share,
    machine_info,
    machine_text,
    percentile,
    runtime_s,
    say,
    scratch_database,
    wait_idle,
    write_report,
)
from hat.event import eventer
from processes import ServerProcess, free_port
from server_hostile import Target, hostile_phase
from server_hostile import evaluate as evaluate_hostile
from server_hostile import markdown as hostile_markdown

from tidings.config.server import DEFAULT_MAX_FRAME_BYTES

SERVERS = ("floor", "hat", "tidings", "tidings_periodic", "tidings_pg", "tidings_pg_periodic")
#: bench/floor_server.py: answers registers and stores nothing, so its rates are the ceiling
#: of any Python server driven by this client on this machine (its register steps only).
FLOOR_KIND = "floor"
FLOOR_STEPS = ("register batch", "register single", "register fire-and-forget")
#: The tidings servers, each compared with hat.
TIDINGS_KINDS = ("tidings", "tidings_periodic")
#: tidings on PostgreSQL, each compared with tidings on SQLite with the same durability:
#: issue 14's goal is "within 2 x" (at least half the rate, at most twice the latency).
PG_KINDS, PG_WITHIN = {"tidings_pg": "tidings", "tidings_pg_periodic": "tidings_periodic"}, 2.0
#: The hostile phase tests framing and budgets, which durability does not change: it runs
#: on hat and on the commit-durability tidings only.
HOSTILE_KINDS = ("hat", "tidings")


@dataclass(frozen=True)
class Sizes:
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


FULL = Sizes(20_000, 100, 5, 200, 200, 50, 20.0, 1000, 200_000)
QUICK = Sizes(2_000, 100, 2, 30, 15, 10, 5.0, 200, 20_000)

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
#: name: (unit, higher is better, goal as tidings ÷ hat) -- issue 14's goals: writes at
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


# -- servers ---------------------------------------------------------------------------------


class BenchServer:
    """One server (``hat`` or ``tidings``) on a free port in a fresh temporary directory,
    with what the benchmark asks of it besides starting and stopping: its CPU time and the
    problems in its log."""

    def __init__(self, kind: str, keep: bool) -> None:
        self.kind = kind
        self.keep = keep
        #: What stop() undoes besides the process (the PostgreSQL kind's scratch database).
        self._cleanup = contextlib.ExitStack()
        work = Path(tempfile.mkdtemp(prefix=f"tidings-bench-{kind}-"))
        ports = {"eventer": free_port()}
        if kind == FLOOR_KIND:
            self.process = ServerProcess.floor(work, ports)
        elif kind == "hat":
            # The hostile phase stores a few hundred thousand events: a map of 1 GiB.
            self.process = ServerProcess.hat_event(work, 1, ports, max_db_size=1 << 30)
        else:
            backend = {"module": "tidings.server.backends.sqlite", "db_path": "ev.db"}
            if kind in PG_KINDS:
                # One database per server: they all run at once.
                url = self._cleanup.enter_context(scratch_database(f"tidings_bench_{kind}"))
                backend = {"module": "tidings.server.backends.postgresql", "url": url}
            if kind.endswith("_periodic"):
                backend |= {"durability": "periodic", "flush_period": 1}
            self.process = ServerProcess.tidings(work, 1, ports, backend=backend)
        self.port = self.process.port
        self.address = self.process.eventer
        self.ps: psutil.Process | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc

    def log_tail(self, lines: int = 30) -> str:
        return self.process.log_tail(lines)

    def log_problems(self, lines: int = 3) -> str:
        """The last warnings and errors in the server's log."""
        found = [
            line
            for line in self.log_tail(200).splitlines()
            if any(w in line.lower() for w in ("warning", "error", "exception"))
        ]
        return " | ".join(found[-lines:])

    async def start(self, timeout: float = 60.0) -> None:
        say(f"[{self.kind}] starting {self.process.config} in {self.process.workdir}")
        started = time.perf_counter()
        await asyncio.to_thread(self.process.start, timeout)
        assert self.proc is not None
        self.ps = psutil.Process(self.proc.pid)
        say(f"[{self.kind}] listening on {self.port} after {time.perf_counter() - started:.1f} s")

    def cpu_seconds(self) -> float:
        return 0.0 if self.ps is None else cpu_seconds(self.ps)

    def stop(self) -> None:
        self.process.stop(30)
        self._cleanup.close()
        if self.proc is not None:
            say(f"[{self.kind}] stopped (exit code {self.proc.returncode})")
        if self.keep:
            say(f"[{self.kind}] work dir kept: {self.process.workdir}")
        else:
            shutil.rmtree(self.process.workdir, ignore_errors=True)


# -- workload --------------------------------------------------------------------------------


def json_payload(data: Any) -> hc.EventPayload:
    return hc.EventPayload(type=hc.EventPayloadType.JSON, data=data)


def reg_event(event_type: tuple[str, ...], data: Any) -> hc.RegisterEvent:
    return hc.RegisterEvent(
        event_type=event_type, source_timestamp=None, payload=json_payload(data)
    )


def ts_key(event: hc.Event) -> tuple[Any, ...]:
    return (event.timestamp.s, event.timestamp.us)


@dataclass
class Run:
    """The figures of one server, plus CPU use per phase."""

    kind: str
    server: BenchServer
    figures: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    last_event: hc.Event | None = None  # newest event the benchmark registered
    errors: dict[str, str] = field(default_factory=dict)  # step -> what went wrong
    hostile: dict[str, dict[str, Any]] = field(default_factory=dict)  # row -> figures

    async def phase(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run ``body``, recording the CPU the server, this client and every other process
        used meanwhile: a ratio is only fair if neither side was starved of cores."""
        me = psutil.Process()
        server0, client0 = self.server.cpu_seconds(), cpu_seconds(me)
        machine, wall0 = MachineCpu(), time.perf_counter()
        await body()
        wall = time.perf_counter() - wall0
        server = self.server.cpu_seconds() - server0
        client = cpu_seconds(me) - client0
        machine.stop()
        self.cpu[name] = {
            "wall_s": round(wall, 2),
            "server_cpu_s": round(server, 2),
            "client_cpu_s": round(client, 2),
            "other_cpu_s": round(machine.other_s(server + client), 2),
        }
        say(
            f"[{self.kind}]   {name}: {wall:.1f} s wall, server {server:.1f} CPU-s, "
            f"client {client:.1f} CPU-s, other processes {self.cpu[name]['other_cpu_s']:.1f} CPU-s"
        )

    def record(self, name: str, value: float) -> None:
        self.figures[name] = round(value, 3 if value < 100 else 1)
        say(f"[{self.kind}]   {name} = {self.figures[name]:,}")


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


async def register_batch(client: eventer.Client, run: Run, sizes: Sizes) -> None:
    n, b = sizes.register_events, sizes.batch
    batches = [
        [reg_event(("bench", "r", "batch", f"k{i % 100}"), {"seq": i}) for i in range(s, s + b)]
        for s in range(0, n, b)
    ]
    # The first step of each server: a few untimed batches warm the client and the server
    # (the first server run also warms the benchmark process itself).
    for w in range(sizes.warmup):
        warm = [reg_event(("bench", "r", "warm", f"k{i}"), {"seq": w}) for i in range(b)]
        check_registered(await client.register_with_response(warm), warm)
    started = time.perf_counter()
    for batch in batches:
        results = await client.register_with_response(batch)
        check_registered(results, batch)
    run.record("register_batch_ev_s", n / (time.perf_counter() - started))
    run.last_event = results[-1]


async def register_single(client: eventer.Client, run: Run, sizes: Sizes) -> None:
    n = sizes.register_events
    events = [reg_event(("bench", "r", "single", f"k{i % 100}"), {"seq": i}) for i in range(n)]
    started = time.perf_counter()
    for event in events:
        results = await client.register_with_response([event])
        check_registered(results, [event])
    run.record("register_single_ev_s", n / (time.perf_counter() - started))
    run.last_event = results[-1]


async def count_events(client: eventer.Client, pattern: tuple[str, ...]) -> int:
    events = await client.query(hc.QueryData(event_types=[pattern], unique_type=False))
    return len(events)


async def register_ff(client: eventer.Client, run: Run, sizes: Sizes) -> None:
    """Fire-and-forget registers, then one register_with_response on the same connection.

    Both servers handle one connection's requests in order, so the marker's reply means the
    events before it were registered; a count query afterwards (untimed if it agrees) checks
    that. If it does not agree yet, the clock runs on until a count query sees them all.
    """
    n = sizes.register_events
    pattern = ("bench", "r", "ff", "*")
    events = [reg_event(("bench", "r", "ff", f"k{i % 100}"), {"seq": i}) for i in range(n)]
    marker = reg_event(("bench", "r", "ff-marker"), {"seq": n})
    started = time.perf_counter()
    for event in events:
        client.register([event])
    try:
        results = await client.register_with_response([marker])
    except ConnectionError:
        raise ConnectionError(
            f"the connection closed {time.perf_counter() - started:.1f} s after the first of "
            f"{n:,} fire-and-forget registers, before the marker's reply"
        ) from None
    elapsed = time.perf_counter() - started
    check_registered(results, [marker])
    if run.kind == FLOOR_KIND:  # stores nothing to count; it answers in request order
        run.record("register_ff_ev_s", n / elapsed)
        return
    count = await count_events(client, pattern)
    while count < n:
        say(f"[{run.kind}]   after the marker only {count:,} of {n:,} ff events are queryable")
        check(time.perf_counter() - started < 60, f"only {count} of {n} ff events stored")
        await asyncio.sleep(0.01)
        count = await count_events(client, pattern)
        elapsed = time.perf_counter() - started
    check(count == n, f"{count} ff events stored, {n} sent")
    run.record("register_ff_ev_s", n / elapsed)
    run.last_event = results[-1]


def query_types() -> list[tuple[str, ...]]:
    return [("bench", "q", g, f"t{i}") for g, count in GROUPS.items() for i in range(count)]


async def query_setup(client: eventer.Client, run: Run, sizes: Sizes) -> None:
    types = query_types()
    started = time.perf_counter()
    for rnd in range(sizes.query_rounds):
        for s in range(0, len(types), sizes.batch):
            batch = [
                reg_event(t, {"round": rnd, "i": s + j})
                for j, t in enumerate(types[s : s + sizes.batch])
            ]
            results = await client.register_with_response(batch)
            check_registered(results, batch)
    run.last_event = results[-1]
    total = len(types) * sizes.query_rounds
    say(
        f"[{run.kind}]   query setup: {total:,} events over {len(types):,} types in "
        f"{time.perf_counter() - started:.1f} s"
    )


async def timed_queries(
    client: eventer.Client,
    query: hc.QueryData,
    verify: Callable[[list[hc.Event]], None],
    count: int,
    warmup: int,
    *,
    min_count: int | None = None,
    budget_s: float | None = None,
) -> tuple[list[float], float]:
    """Milliseconds per query, and the client's median CPU milliseconds per query (sending,
    receiving, decoding: a floor under the latency that no server can remove); every
    answer verified. Stops early (at ``min_count`` or more) when ``budget_s`` is spent."""
    for _ in range(warmup):
        verify(await client.query(query))
    times: list[float] = []
    client_cpu: list[float] = []
    # The benchmark process holds many objects of its own (the events it registered, their
    # answers): out of the collector's sight during the series, so that a full collection
    # of them does not land on some query's time, whichever server answers it.
    gc.collect()
    gc.freeze()
    try:
        series = time.perf_counter()
        for _ in range(count):
            started, started_cpu = time.perf_counter(), time.process_time()
            events = await client.query(query)
            times.append((time.perf_counter() - started) * 1000)
            client_cpu.append((time.process_time() - started_cpu) * 1000)
            verify(events)
            if (
                budget_s is not None
                and min_count is not None
                and len(times) >= min_count
                and time.perf_counter() - series > budget_s
            ):
                break
    finally:
        gc.unfreeze()
    return times, percentile(client_cpu, 50)


def verify_latest(pattern: tuple[str, ...], expected: int, rounds: int) -> Callable[..., None]:
    types = {t for t in query_types() if hc.matches_query_type(t, pattern)}
    check(len(types) == expected, f"{pattern} matches {len(types)} types, not {expected}")

    def verify(events: list[hc.Event]) -> None:
        check(
            len(events) == expected,
            f"latest {pattern}: {len(events)} events, expected {expected} (one per type)",
        )
        got = {tuple(e.event_type) for e in events}
        check(got == types, f"latest {pattern}: wrong or repeated types ({len(got)} distinct)")
        stale = [e for e in events if e.payload is None or e.payload.data["round"] != rounds - 1]
        check(not stale, f"latest {pattern}: {len(stale)} events are not the newest of their type")
        keys = [ts_key(e) for e in events]
        check(keys == sorted(keys, reverse=True), f"latest {pattern}: not newest first")

    return verify


async def latest_queries(client: eventer.Client, run: Run, sizes: Sizes) -> None:
    for name, (pattern, expected) in LATEST.items():
        query = hc.QueryData(
            event_types=[pattern],
            unique_type=True,
            max_results=expected,
            order=hc.Order.DESCENDING,
            order_by=hc.OrderBy.TIMESTAMP,
        )
        verify = verify_latest(pattern, expected, sizes.query_rounds)
        if expected >= 3000:
            times, client_ms = await timed_queries(
                client,
                query,
                verify,
                sizes.queries_3000,
                min(sizes.warmup, 2),
                min_count=sizes.min_queries_3000,
                budget_s=sizes.query_budget_s,
            )
        else:
            times, client_ms = await timed_queries(
                client, query, verify, sizes.queries, sizes.warmup
            )
        say(f"[{run.kind}]   {name}: {len(times)} queries")
        run.record(f"{name}_p50_ms", percentile(times, 50))
        run.record(f"{name}_p99_ms", percentile(times, 99))
        run.record(f"{name}_client_cpu_ms", client_ms)


async def ordered_queries(client: eventer.Client, run: Run, sizes: Sizes) -> None:
    newest = run.last_event
    assert newest is not None
    query = hc.QueryData(
        event_types=[ORDERED_PATTERN],
        order_by=hc.OrderBy.TIMESTAMP,
        order=hc.Order.DESCENDING,
        max_results=ORDERED_RESULTS,
    )

    def verify(events: list[hc.Event]) -> None:
        check(len(events) == ORDERED_RESULTS, f"ordered: {len(events)} events, not 100")
        check(all(e.event_type[0] == "bench" for e in events), "ordered: a non-bench type")
        keys = [ts_key(e) for e in events]
        check(keys == sorted(keys, reverse=True), "ordered: not newest first")
        check(keys[0] == ts_key(newest), "ordered: the first event is not the newest one")
        ids = {e.event_id for e in events}
        check(len(ids) == len(events), "ordered: repeated events")

    times, client_ms = await timed_queries(client, query, verify, sizes.queries, sizes.warmup)
    run.record("ordered_p50_ms", percentile(times, 50))
    run.record("ordered_p99_ms", percentile(times, 99))
    run.record("ordered_client_cpu_ms", client_ms)


async def notify_latency(client: eventer.Client, run: Run, sizes: Sizes) -> None:
    subscriber = await eventer.connect(run.server.address, [NOTIFY_PATTERN])
    arrivals: dict[int, float] = {}
    waiting: dict[int, asyncio.Future[float]] = {}
    problems: list[str] = []

    async def receive() -> None:
        while True:
            events = await subscriber.receive()
            now = time.perf_counter()
            for event in events:
                if event.event_type[:2] != ("bench", "n") or event.payload is None:
                    problems.append(f"notify of an unsubscribed event {event.event_type}")
                    continue
                seq = event.payload.data["seq"]
                if seq in arrivals:
                    problems.append(f"notify of seq {seq} twice")
                arrivals[seq] = now
                future = waiting.pop(seq, None)
                if future is not None and not future.done():
                    future.set_result(now)

    receiver = asyncio.create_task(receive())
    try:
        # The subscription is sent right after connecting; wait until it is in effect.
        warm = -1
        while True:
            future = waiting[warm] = asyncio.get_running_loop().create_future()
            await client.register_with_response([reg_event(("bench", "n", "x"), {"seq": warm})])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(future), 0.5)
                break
            warm -= 1
            check(warm > -20, "the subscriber received no notify within 10 s")
        latencies: list[float] = []
        loop = asyncio.get_running_loop()
        for seq in range(sizes.notify_events):
            future = waiting[seq] = loop.create_future()
            event = reg_event(("bench", "n", f"k{seq % 10}"), {"seq": seq})
            started = time.perf_counter()
            results = await client.register_with_response([event])
            try:
                arrived = await asyncio.wait_for(future, 10)
            except TimeoutError:
                raise WrongAnswer(f"no notify for seq {seq} within 10 s") from None
            latencies.append((arrived - started) * 1000)
            check_registered(results, [event])
        run.last_event = results[-1]
        await asyncio.sleep(0.1)  # anything stray would arrive now
        check(not problems, f"notify: {problems[:3]}")
        check(
            set(range(sizes.notify_events)) <= set(arrivals),
            "notify: events missing",
        )
        run.record("notify_p50_ms", percentile(latencies, 50))
        run.record("notify_p99_ms", percentile(latencies, 99))
    finally:
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await receiver
        await subscriber.async_close()


STEPS: list[tuple[str, Callable[[eventer.Client, Run, Sizes], Awaitable[None]]]] = [
    ("register batch", register_batch),
    ("register single", register_single),
    ("register fire-and-forget", register_ff),
    ("query setup", query_setup),
    ("latest queries", latest_queries),
    ("ordered query", ordered_queries),
    ("notify latency", notify_latency),
]
NEEDS = {"latest queries": "query setup", "ordered query": "query setup"}


async def settle(server: BenchServer, timeout: float = 120.0) -> None:
    """Wait until the server is idle (under 10% of a core for 0.5 s), e.g. still working off
    a dropped client's backlog, so that it does not slow the next measure."""
    if server.ps is None or not await wait_idle(server.ps, max_cores=0.1, timeout=timeout):
        say(f"[{server.kind}] still busy after {timeout:g} s")


@dataclass
class Bench:
    """One server's run through the steps: its figures, its client and the steps that
    failed (a later step that needs one is skipped)."""

    run: Run
    sizes: Sizes
    client: eventer.Client | None = None
    failed: set[str] = field(default_factory=set)
    #: Set once the server could not start or exited: it takes no further step.
    down: bool = False

    async def step(
        self, name: str, step: Callable[[eventer.Client, Run, Sizes], Awaitable[None]]
    ) -> None:
        """Run one step; a failing step (wrong answer, dropped connection) is recorded in
        ``run.errors`` and the next one gets a new connection."""
        run, server, kind = self.run, self.run.server, self.run.kind
        if self.down or (kind == FLOOR_KIND and name not in FLOOR_STEPS):
            return
        if NEEDS.get(name) in self.failed:
            run.errors[name] = f"skipped: {NEEDS[name]} failed"
            say(f"[{kind}] {name} skipped")
            return
        if self.client is None or not self.client.is_open:
            self.client = await eventer.connect(server.address)
        say(f"[{kind}] {name} ...")
        try:
            await run.phase(name, lambda c=self.client: step(c, run, self.sizes))
        except Exception as exc:
            traceback.print_exc()
            self.failed.add(name)
            logged = server.log_problems()
            run.errors[name] = f"{type(exc).__name__}: {exc}" + (
                f"; server log: {logged}" if logged else ""
            )
            say(f"!! [{kind}] {name} FAILED: {run.errors[name]}")
            await settle(server)
        if server.proc is not None and server.proc.poll() is not None:
            self.fail("server", f"RuntimeError: {kind} server exited:\n{server.log_tail()}")

    async def hostile(self) -> None:
        """The hostile phase (issue 8's rows) against this server alone."""
        run, server = self.run, self.run.server
        if self.down or server.proc is None:
            return
        say(f"[{run.kind}] hostile clients ...")
        target = Target(run.kind, server.address, server.port, server.proc.pid)
        try:
            run.hostile = await hostile_phase(target, self.sizes.hostile_events, run.phase)
        except Exception as exc:
            traceback.print_exc()
            run.errors["hostile"] = f"{type(exc).__name__}: {exc}"
            say(f"!! [{run.kind}] hostile FAILED: {run.errors['hostile']}")

    def fail(self, what: str, error: str) -> None:
        self.down = True
        self.run.errors[what] = error
        say(f"!! {self.run.kind} FAILED: {error}")

    async def close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.async_close()
        self.run.server.stop()


# -- results ---------------------------------------------------------------------------------


def judge(
    result: dict[str, Any],
    kind: str,
    reference: str,
    goal_of: Callable[[bool, float], tuple[str, float]],
) -> dict[str, dict[str, Any]]:
    """Each measure of run ``kind`` divided by ``reference``'s, with its goal: ``goal_of``
    gives, for a measure (higher better?, its factor against hat), the goal's text and the
    bound the ratio must reach (at least it if higher is better, else at most)."""
    goals: dict[str, dict[str, Any]] = {}
    for name, (_, higher, factor) in MEASURES.items():
        value, base = result.get(f"{name}_{kind}"), result.get(f"{name}_{reference}")
        ratio = None if value is None or base is None or base == 0 else round(value / base, 3)
        goal, bound = goal_of(higher, factor)
        met = ratio is not None and (ratio >= bound if higher else ratio <= bound)
        goals[name] = {"goal": goal, "ratio": ratio, "met": met}
    return goals


def evaluate(result: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    """Each measure of tidings server ``kind`` against hat's, with its goal."""
    return judge(
        result,
        kind,
        "hat",
        lambda higher, factor: (f"{'>=' if higher else '<='} {factor:g}x hat", factor),
    )


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if unit == "ev/s" else f"{value:,.2f}"


def table_rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    """measure, hat, then per tidings kind its figure and ratio, then the goal and whether
    each kind met it."""
    rows = []
    for name, (unit, _, _) in MEASURES.items():
        cells = [
            f"{name} ({unit})",
            fmt(result.get(f"{name}_hat"), unit),
            *floor_cells(result, name),
        ]
        met = []
        judged = [(kind, result["goals"][kind][name]) for kind in TIDINGS_KINDS]
        judged += [(kind, result["pg_goals"][kind][name]) for kind in PG_KINDS]
        for kind, g in judged:
            cells += [
                fmt(result.get(f"{name}_{kind}"), unit),
                "n/a" if g["ratio"] is None else f"{g['ratio']:.2f}",
            ]
            met.append("yes" if g["met"] else "no")
        rows.append((*cells, result["goals"][TIDINGS_KINDS[0]][name]["goal"], " / ".join(met)))
    for name in EXTRAS:
        cells = [f"{name} (ms)", fmt(result.get(f"{name}_hat"), "ms"), "", ""]
        for kind in (*TIDINGS_KINDS, *PG_KINDS):
            cells += [fmt(result.get(f"{name}_{kind}"), "ms"), ""]
        rows.append((*cells, "", ""))
    return rows


def floor_cells(result: dict[str, Any], name: str) -> list[str]:
    """The floor server's figure of a measure and its ratio to hat's: the most any server
    could reach against hat with this client here (register measures only)."""
    f, h = result.get(f"{name}_{FLOOR_KIND}"), result.get(f"{name}_hat")
    if f is None:
        return ["", ""]
    return [fmt(f, MEASURES[name][0]), "n/a" if not h else f"{f / h:.2f}"]


def evaluate_pg(result: dict[str, Any], pg_kind: str) -> dict[str, dict[str, Any]]:
    """tidings on PostgreSQL against tidings on SQLite with the same durability."""
    return judge(
        result,
        pg_kind,
        PG_KINDS[pg_kind],
        lambda higher, _: (
            f"within {PG_WITHIN:g}x of SQLite",
            1 / PG_WITHIN if higher else PG_WITHIN,
        ),
    )


HEADER = (
    "measure",
    "hat 0.8.5 (lmdb)",
    "floor (stores nothing)",
    "÷ hat",
    "tidings commit",
    "÷ hat",
    "tidings periodic",
    "÷ hat",
    "PostgreSQL commit",
    "÷ SQLite",
    "PostgreSQL periodic",
    "÷ SQLite",
    "goal (÷ hat; PostgreSQL: within 2x of SQLite)",
    "met (commit / periodic / PostgreSQL commit / periodic)",
)


GOAL_COLUMN = HEADER.index("goal (÷ hat; PostgreSQL: within 2x of SQLite)")


def print_table(result: dict[str, Any]) -> None:
    header = HEADER
    rows = [header, *table_rows(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        print(
            "  ".join(
                c.ljust(w) if j in (0, GOAL_COLUMN) else c.rjust(w)
                for j, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if i == 0:
            print("  ".join("-" * w for w in widths))


def write_markdown(result: dict[str, Any], quick: bool, only: str | None, runtime: float) -> str:
    m = result["machine"]
    cmd = ".venv/bin/python bench/server.py" + (" --quick" if quick else "")
    cmd += f" --only {only}" if only else ""
    lines = [
        "# tidings event server vs hat-event 0.8.5",
        "",
        f"Run `{cmd}` on {m['date']}, {runtime / 60:.1f} min; {result['code']}.",
        "",
        f"Machine: {machine_text(m)}; {m['os']}; Python "
        f"{m['python']}; hat-event {m['hat_event']}. Client and server share the machine.",
        "",
        f"| {' | '.join(HEADER)} |",
        "|---|" + "---:|" * (GOAL_COLUMN - 1) + "---|:---:|",
    ]
    for row in table_rows(result):
        met = row[-1].replace("no", "**no**")
        lines.append(f"| {' | '.join(row[:-1])} | {met} |")
    if result["errors"]:
        lines += ["", "## Errors", ""] + [
            f"- **{k}**: {v}".replace("\n", "<br>") for k, v in result["errors"].items()
        ]
    lines += hostile_markdown(result)
    lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    lines += [
        "",
        "## CPU per phase",
        "",
        "| server | phase | wall s | server CPU-s | client CPU-s | other CPU-s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for kind, phases in result["cpu"].items():
        for phase, c in phases.items():
            lines.append(
                f"| {kind} | {phase} | {c['wall_s']} | {c['server_cpu_s']} | "
                f"{c['client_cpu_s']} | {c['other_cpu_s']} |"
            )
    s = result["sizes"]
    lines += [
        "",
        "## Method",
        "",
        "Each server is a subprocess in a fresh temporary directory, driven by hat-event "
        "0.8.5's `hat.event.eventer` client (asyncio, in the benchmark process; one connection "
        "for the workload, a second one subscribed to `('bench','n','*')` for notify). "
        "hat: `hat-event-server` with the lmdb backend (flush_period 1 s, latest and "
        "TIMESTAMP-ordered subscriptions `[['*']]`). tidings: `python -m tidings.cli server` "
        "with the SQLite backend, once with `durability: commit` and once with `durability: "
        "periodic` (`flush_period: 1`, hat's), and the same two on the PostgreSQL backend (a "
        "scratch database on the local server). All log at WARNING; the hostile "
        "phase runs on hat and on the commit tidings. floor: `bench/floor_server.py`, which "
        "answers registers as a server would (tidings' frame reading, pre-scan, hat-sbs "
        "decode and encode, numbering) and stores nothing: its register rates, run with the "
        "same client, bound what any Python server can reach against hat here (it runs the "
        "register steps only; its fire-and-forget count check is skipped).",
        "",
        f"1. register_batch: {s['register_events']:,} events in `register_with_response` "
        f"batches of {s['batch']}, one request at a time; register_single: "
        f"{s['register_events']:,} one-event `register_with_response` calls, one at a time; "
        f"register_ff: {s['register_events']:,} one-event `register` calls, then one "
        "`register_with_response` on the same connection (both servers handle a connection's "
        "requests in order); the clock stops at its reply, and a count query then checks that "
        "all events are stored.",
        f"2. Query setup: {s['query_rounds']} events for each of 3,000 types "
        "`('bench','q',g,'tN')` (groups of 100, 300, 2,600), in batches of 100. latestN: "
        "`QueryData(event_types=[pattern], unique_type=True, max_results=N)`, descending by "
        "timestamp, with `('bench','q','g0','*')`, `('bench','q','g1','*')` and "
        f"`('bench','q','*')`; {s['queries']} timed runs ({s['queries_3000']} for 3,000 types, "
        f"at least {s['min_queries_3000']}, within {s['query_budget_s']:g} s) after "
        f"{s['warmup']} untimed ones. Each answer must have one event per matching type, each "
        "the newest of its type, newest first. ordered: `('bench','*')` by TIMESTAMP "
        f"descending, max_results 100, {s['queries']} runs; the answer must be 100 distinct "
        "events, newest first, starting with the newest event registered. During each timed "
        "series the benchmark process's own objects are out of its garbage collector's sight "
        "(`gc.freeze()`), so that no full collection of them lands on a query's time.",
        f"3. Notify: {s['notify_events']:,} one-event `register_with_response` calls, one at "
        "a time; latency from just before the call to the subscriber's receipt of the notify "
        "with the same sequence number (the next call waits for both).",
        "",
    ]
    return "\n".join(lines)


def fairness_notes(quick: bool, sizes: Sizes) -> list[str]:
    notes = []
    if quick:
        notes.append(
            f"--quick run: {sizes.register_events:,} events per register measure, "
            f"{sizes.query_rounds} events per query type, {sizes.queries} queries per series, "
            f"{sizes.notify_events} notifies"
        )
    notes += [
        "Durability: hat's lmdb backend answers from memory and writes to disk every "
        "flush_period (1 s), so a crash may lose the last second of acknowledged events. "
        "tidings commit answers after the SQLite commit (WAL, synchronous=NORMAL: durable "
        "against a process crash, not against power loss until the next WAL sync); tidings "
        "periodic answers once the session is written into the open transaction and commits "
        "every flush_period (1 s), so a crash may lose the last second, as with hat.",
        "Both servers share the machine's cores with the benchmark client, which is the same "
        "pure-Python hat client for both; where the client is the bottleneck (see client "
        "CPU-s) the ratio understates the difference between the servers.",
        "Every server is up for the whole run and each step runs on each server in turn (the "
        "order rotating from step to step), every server idle before each phase; other load "
        "on the machine "
        "(other CPU-s per phase) affects them differently.",
        "tidings_pg, tidings_pg_periodic: the PostgreSQL server's own work counts as other "
        "processes' CPU-s in their "
        "phases (it is part of that configuration, not load from elsewhere).",
    ]
    return notes


def load_notes(runs: dict[str, Run]) -> list[str]:
    """A note per server whose phases shared the cores with other work on the machine."""
    cores = psutil.cpu_count() or 1
    notes = []
    for kind, run in runs.items():
        wall = sum(c["wall_s"] for c in run.cpu.values())
        other = sum(c["other_cpu_s"] for c in run.cpu.values())
        share = cpu_share(other, wall)
        if share > LOADED_SHARE:
            notes.append(
                f"{kind}: other processes used {other:.1f} CPU-s ({share:.0%} of {cores} cores) "
                f"over its {wall:.0f} s of measuring; its figures are slower than on an idle "
                "machine"
            )
    return notes


async def run_all(
    kinds: list[str], sizes: Sizes, keep: bool, hostile: str
) -> tuple[dict[str, Run], dict[str, str]]:
    """Every server up at once, each step run on each server in turn (the order rotating
    from step to step), every server idle before each phase: the machine's speed drifts by
    up to a third within minutes, and servers measured one after another saw different
    machines. The hostile rows run last, server by server. Errors (start-up, per step) are
    collected, figures kept."""
    benches: list[Bench] = []
    for kind in kinds:
        bench = Bench(Run(kind, BenchServer(kind, keep)), sizes)
        benches.append(bench)
        try:
            await bench.run.server.start()
        except Exception as exc:
            traceback.print_exc()
            bench.fail("server", f"{type(exc).__name__}: {exc}")
    try:
        for index, (name, step) in enumerate(STEPS if hostile != "only" else []):
            shift = index % len(benches)
            for bench in benches[shift:] + benches[:shift]:
                await asyncio.gather(*(settle(b.run.server) for b in benches if not b.down))
                await bench.step(name, step)
        for bench in benches:
            if hostile != "off" and bench.run.kind in HOSTILE_KINDS:
                await bench.hostile()
    finally:
        for bench in benches:
            await bench.close()
    runs = {bench.run.kind: bench.run for bench in benches}
    errors = {
        f"{kind}: {step}": error for kind, run in runs.items() for step, error in run.errors.items()
    }
    return runs, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, about a minute")
    parser.add_argument("--only", choices=SERVERS, help="run one server only")
    parser.add_argument("--keep", action="store_true", help="keep the servers' work directories")
    parser.add_argument(
        "--hostile",
        choices=("on", "off", "only"),
        default="on",
        help="the hostile-clients phase after the others (on), not at all, or alone",
    )
    args = parser.parse_args()
    say(f"server benchmark ({'quick' if args.quick else 'full'})")
    machine = machine_info(spark=False)
    machine["os"] = platform.platform()
    machine["hat_event"] = version("hat-event")
    say(f"machine: {machine}")
    code = code_version()
    say(f"code: {code}")
    sizes = QUICK if args.quick else FULL
    kinds = [args.only] if args.only else list(SERVERS)
    if args.hostile == "only":
        kinds = [kind for kind in kinds if kind in HOSTILE_KINDS]
    runs, errors = asyncio.run(run_all(kinds, sizes, args.keep, args.hostile))

    result: dict[str, Any] = {"machine": machine, "code": code, "quick": args.quick}
    for name in [*MEASURES, *EXTRAS]:
        for kind in SERVERS:
            run = runs.get(kind)
            result[f"{name}_{kind}"] = None if run is None else run.figures.get(name)
    result["goals"] = {kind: evaluate(result, kind) for kind in TIDINGS_KINDS}
    result["pg_goals"] = {pg_kind: evaluate_pg(result, pg_kind) for pg_kind in PG_KINDS}
    result["errors"] = errors
    notes = fairness_notes(args.quick, sizes)
    if args.only:
        notes.insert(0, f"--only {args.only}: the other server was not run; no ratios")
    notes += load_notes(runs)
    result["notes"] = notes
    result["cpu"] = {kind: run.cpu for kind, run in runs.items()}
    result["hostile"] = {
        kind: {
            "rows": run.hostile,
            "goals": evaluate_hostile(
                run.hostile, DEFAULT_MAX_FRAME_BYTES if kind in TIDINGS_KINDS else None
            ),
        }
        for kind, run in runs.items()
        if run.hostile
    }
    result["sizes"] = asdict(sizes)
    runtime = runtime_s()
    paths = write_report("server", result, write_markdown(result, args.quick, args.only, runtime))
    print()
    print_table(result)
    print()
    say(f"wrote {paths[0]} and {paths[1]} ({runtime / 60:.1f} min)")
    if errors:
        for kind, error in errors.items():
            say(f"!! {kind} FAILED: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
