"""Benchmark of tidings' FTN18 streams, side by side with FutoIn's own server and JetStream.

Run ``.venv/bin/python bench/streams.py [--quick]`` from the repository. In one run it measures

(a) tidings' stream server against FutoIn's own (futoin-eventstream DBGenService +
    DBPushService on a NodeExecutor, ``bench/futoin/server.js``), both on PostgreSQL and both
    driven by the same FutoIn client (``tests/interop/futoin/client.js``): a backlog drained by
    a ReliableReceiver (push), by a registered PollFace loop and by LIVE polls, and the
    generator -> consumer latency at 1,000 events/s offered (GenFace.addEvent; push and poll);
(b) tidings' Python consumer (``tidings.streams.client.consume``, push) against a NATS
    JetStream durable pull consumer through nats-py (fetch batches): drain rate and latency;

with the CPU each phase took from the server, PostgreSQL, the client and other processes,
and writes ``bench/results/streams.json`` and ``bench/results/streams.md``. Its scratch
databases (PostgreSQL on 127.0.0.1:5432), servers and work directory are removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import psutil
import psycopg
import websockets
from common import (
    LOADED_SHARE,
    PG,
    REPO,
    MachineCpu,
    code_version,
    cpu_seconds,
    cpu_share,
    goals_met,
    machine_info,
    machine_text,
    percentile,
    runtime_s,
    say,
    scratch_database,
    write_report,
)
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from processes import TIDINGS, NatsServer, ServerProcess, free_port, local_address, wait_for_port

from tidings.config.passwords import hash_password
from tidings.events.model import NewEvent, PayloadKind
from tidings.server.store import EventStore
from tidings.streams.client import StreamClient, StreamEvent, consume

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
class Sizes:
    backlog: int  # (a) events drained per run (plus one marker event)
    runs: int  # runs per rate; the median is reported
    latency_s: float  # seconds of load per latency phase
    warmup_s: float  # first seconds of a latency load left out
    py_events: int  # (b) events drained per run
    py_runs: int


FULL = Sizes(20_000, 3, 10.0, 1.0, 100_000, 3)
QUICK = Sizes(10_000, 2, 3.0, 0.5, 20_000, 1)


@dataclass
class Report:
    figures: dict[str, float | None] = field(default_factory=dict)
    details: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    cpu: list[dict[str, Any]] = field(default_factory=list)

    def detail(self, section: str, text: str) -> None:
        self.details.setdefault(section, []).append(text)

    def note(self, text: str) -> None:
        self.notes.append(text)


# -- CPU accounting --------------------------------------------------------------------------


def tree_cpu(proc: psutil.Process | None) -> float:
    """CPU-s of a process and its descendants (0 for None)."""
    if proc is None:
        return 0.0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0.0
    return sum(cpu_seconds(p) for p in procs)


def postgres_cpu() -> dict[int, float]:
    """CPU-s of each PostgreSQL process, by pid."""
    out = {}
    for proc in psutil.process_iter(["name"]):
        if (proc.info["name"] or "").startswith("postgres"):
            out[proc.pid] = cpu_seconds(proc)
    return out


def children_cpu() -> float:
    """CPU-s of this process's children that have been waited for (the Node clients)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Usage:
    """CPU over one measured run: the server's process tree, PostgreSQL, the clients (the
    Node children waited for meanwhile, and this process) and every other process."""

    def __init__(self, server_pid: int | None) -> None:
        self.server = psutil.Process(server_pid) if server_pid else None
        self.me = psutil.Process()
        self.started = time.perf_counter()
        self.machine = MachineCpu()
        self.server0 = tree_cpu(self.server)
        self.db0 = postgres_cpu()
        self.children0 = children_cpu()
        self.own0 = cpu_seconds(self.me)

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self.started
        self.machine.stop()
        server = tree_cpu(self.server) - self.server0
        db = sum(cpu - self.db0.get(pid, 0.0) for pid, cpu in postgres_cpu().items())
        node = children_cpu() - self.children0
        own = cpu_seconds(self.me) - self.own0
        other = self.machine.other_s(server + db + node + own)
        return {
            "wall_s": wall,
            "server_cpu_s": server,
            "db_cpu_s": max(db, 0.0),
            "node_cpu_s": node,
            "bench_cpu_s": own,
            "other_share": cpu_share(other, wall),
        }


class CpuSampler:
    """One process's CPU-s sampled every few ms in a thread, to tell the CPU it used
    between two moments (epoch seconds; the kernel counts CPU in 10 ms ticks)."""

    def __init__(self, pid: int, interval: float = 0.005) -> None:
        self.proc = psutil.Process(pid)
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), cpu_seconds(self.proc)))
            self._stop.wait(self.interval)

    def stop(self) -> CpuSampler:
        self._stop.set()
        self._thread.join()
        return self

    def at(self, when: float) -> float:
        before = [cpu for t, cpu in self.samples if t <= when]
        return before[-1] if before else (self.samples[0][1] if self.samples else 0.0)

    def between(self, start: float, end: float) -> float:
        return self.at(end) - self.at(start)


def bound_text(client_core: float, server_core: float, client: str) -> str:
    if client_core >= BOUND_SHARE:
        return f"{client} (CPU at {client_core:.0%} of a core)"
    if server_core >= BOUND_SHARE:
        return f"server CPU ({server_core:.0%} of a core)"
    return "neither CPU-bound (round trips, commits, waits)"


def record_cpu(
    report: Report,
    phase: str,
    usage: dict[str, float],
    window_s: float,
    client_cpu_s: float,
    client: str = "FutoIn client",
) -> dict[str, Any]:
    """One row of the CPU table: each part's cores over the client's measured window."""
    client_core = client_cpu_s / window_s
    server_core = usage["server_cpu_s"] / window_s
    row = {
        "phase": phase,
        "window_s": round(window_s, 3),
        "server_cores": round(server_core, 2),
        "postgres_cores": round(usage["db_cpu_s"] / window_s, 2),
        "client_cores": round(client_core, 2),
        "other_share": round(usage["other_share"], 3),
        "bound": bound_text(client_core, server_core, client),
    }
    report.cpu.append(row)
    return row


# -- databases and backlogs ------------------------------------------------------------------


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


# -- servers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """How the FutoIn client reaches one server."""

    name: str
    push_url: str
    poll_url: str
    poll_version: str
    gen_url: str


def tidings_server(work: Path, url: str) -> tuple[ServerProcess, Endpoint]:
    """``tidings server`` on ``url`` (PostgreSQL, or a SQLite file: the embedded default)
    with one stream ``bench`` at ``/`` (not started)."""
    eventer, port = free_port(), free_port()
    backend = (
        {"module": "tidings.server.backends.sqlite", "db_path": url.removeprefix("sqlite:///")}
        if url.startswith("sqlite:///")
        else {"module": "tidings.server.backends.postgresql", "url": url}
    )
    config = {
        "type": "event",
        "backend": backend,
        "engine": {"server_id": 1},
        "eventer_server": {"address": local_address(eventer)},
        "stream_users": {USER: {"password_hash": hash_password(PASSWORD, n=2**10)}},
        "streams": [
            {
                "name": "bench",
                "port": port,
                "path": "/",
                "types": {FTN18_TYPE: list(EVENT_TYPE)},
                "secure_channel": True,
            }
        ],
    }
    server = ServerProcess(
        [*TIDINGS, "server"], work / f"tidings-{port}", config, {"eventer": eventer, "s": port}
    )
    base = f"127.0.0.1:{port}/"
    return server, Endpoint(
        "tidings", f"secure+ws://{base}", f"ws://{base}", "1.1", f"secure+ws://{base}"
    )


class FutoInServer:
    """FutoIn's own server (bench/futoin/server.js) on a PostgreSQL database; started again
    whenever it died (it exits when a consumer leaves with a push unanswered)."""

    def __init__(self, work: Path, db: str) -> None:
        self.port = free_port()
        self.db = db
        self.log = work / "futoin-server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        base = f"127.0.0.1:{self.port}/"
        # Its poll is served only at 1.0 and only over WebSocket once push is served.
        self.endpoint = Endpoint(
            "futoin", f"secure+ws://{base}", f"ws://{base}", "1.0", f"secure+ws://{base}"
        )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def ensure(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        env = os.environ | {
            "DB_EVT_TYPE": "postgresql",
            "DB_EVT_HOST": "127.0.0.1",
            "DB_EVT_PORT": "5432",
            "DB_EVT_USER": "root",
            "DB_EVT_DB": self.db,
            "DB_EVT_MAXCONN": "1",
        }
        options = json.dumps({"port": self.port, "users": {USER: PASSWORD}})
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                ["node", str(SERVER_JS), options],
                cwd=FUTOIN_DIR,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.starts += 1
        wait_for_port(self.port, 30, process=self.proc, log=self.log)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def running(server: ServerProcess) -> Iterator[ServerProcess]:
    server.start(60)
    try:
        yield server
    finally:
        server.stop()


# -- the FutoIn client -----------------------------------------------------------------------


@dataclass
class ClientRun:
    lines: list[dict[str, Any]]
    code: int
    usage: dict[str, float]
    stderr: str
    sampler: CpuSampler | None

    @property
    def done(self) -> dict[str, Any] | None:
        return next((line for line in self.lines if line.get("done")), None)

    def last(self, key: str) -> dict[str, Any] | None:
        return next((line for line in reversed(self.lines) if key in line), None)

    def problem(self) -> str:
        errors = [line for line in self.lines if "error" in line][:3]
        return f"exit {self.code}, errors {errors}, stderr {self.stderr[-500:]!r}"


def node_client(
    options: dict[str, Any], server_pid: int | None, timeout: float, prof_dir: Path | None = None
) -> ClientRun:
    """Run client.js with ``options`` to its end, with the CPU used meanwhile."""
    command = ["node"]
    if prof_dir is not None:
        command += ["--cpu-prof", f"--cpu-prof-dir={prof_dir}"]
    usage = Usage(server_pid)
    sampler = CpuSampler(server_pid) if server_pid else None
    proc = subprocess.Popen(
        [*command, str(CLIENT_JS), json.dumps(options)],
        cwd=FUTOIN_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    figures = usage.stop()
    if sampler is not None:
        sampler.stop()
    lines = [json.loads(raw) for raw in out.splitlines() if raw.startswith(b"{")]
    return ClientRun(lines, proc.returncode, figures, err.decode(errors="replace"), sampler)


def rate_options(ep: Endpoint, mode: str, run: int, backlog: int, marker: int) -> dict[str, Any]:
    """The client's options for one drain: reliable consumers read the marker and the
    backlog, LIVE polls start after the marker."""
    base = {"creds": CREDS, "quiet": True, "count": backlog + 1}
    if mode == "reliable_push":
        return base | {
            "mode": "reliable",
            "url": ep.push_url,
            "component": f"PUSH{run}",
            "linger_ms": 200,
        }
    poll = base | {"mode": "poll", "url": ep.poll_url, "version": ep.poll_version}
    if mode.startswith("reliable_poll"):
        return poll | {"component": f"POLL{run}{mode[-4:].upper()}"}
    return poll | {"component": "LIVE", "last_id": str(marker), "count": backlog}


# -- phase (a): rates ------------------------------------------------------------------------


@dataclass
class Drain:
    count: int
    ms: float
    first_ms: float
    client_cpu_s: float
    first_cpu_s: float
    first_us: int
    start_us: int
    usage: dict[str, float]
    steady_server_cpu_s: float

    @property
    def rate(self) -> float:
        """Events / (client start to last event): what a consumer starting afresh gets."""
        return self.count / (self.ms / 1000)

    @property
    def steady_s(self) -> float:
        return max((self.ms - self.first_ms) / 1000, 1e-3)

    @property
    def steady_rate(self) -> float:
        """Events after the first / (first to last event): the delivery rate itself."""
        return (self.count - 1) / self.steady_s

    @property
    def steady_client_core(self) -> float:
        return (self.client_cpu_s - self.first_cpu_s) / self.steady_s


def drain_once(
    ep: Endpoint,
    pid: int | None,
    mode: str,
    run: int,
    sizes: Sizes,
    marker: int,
    prof_dir: Path | None = None,
) -> Drain:
    options = rate_options(ep, mode, run, sizes.backlog, marker)
    result = node_client(options, pid, timeout=180, prof_dir=prof_dir)
    done = result.done
    if done is None:
        raise RuntimeError(
            f"{ep.name} {mode}: the FutoIn client did not finish: {result.problem()}"
        )
    start = done["start_ms"] / 1000
    first, last = start + (done["first_ms"] or 0) / 1000, start + done["ms"] / 1000
    return Drain(
        options["count"],
        done["ms"],
        done["first_ms"] or 0.0,
        done["cpu_ms"] / 1000,
        (done["first_cpu_ms"] or 0.0) / 1000,
        done["first_us"] or 0,
        done["start_us"],
        result.usage,
        result.sampler.between(first, last) if result.sampler else 0.0,
    )


def drain_text(drain: Drain) -> str:
    return (
        f"{drain.rate:,.0f} ev/s ({drain.ms:,.0f} ms, first event at {drain.first_ms:,.0f} ms, "
        f"{drain.steady_rate:,.0f} ev/s after it with the client at "
        f"{drain.steady_client_core:.0%} of a core)"
    )


def phase_rates(
    servers: dict[str, tuple[Endpoint, Callable[[], int | None]]],
    markers: dict[str, int],
    sizes: Sizes,
    report: Report,
) -> dict[str, Drain]:
    """Each rate on each server, runs interleaved (tidings, FutoIn, tidings, ...); the
    median run of each."""
    medians: dict[str, Drain] = {}
    for mode in [*RATE_MODES, "reliable_poll_http"]:
        for name, (ep, pid_of) in servers.items():
            if mode == "reliable_poll_http":
                if name != "tidings":
                    continue
                ep = Endpoint(ep.name, ep.push_url, "http" + ep.poll_url[2:], "1.1", ep.gen_url)
            drains = []
            for run in range(1, sizes.runs + 1):
                drains.append(drain_once(ep, pid_of(), mode, run, sizes, markers[name]))
                say(f"  {name} {mode} run {run}: {drain_text(drains[-1])}")
            key = rate_key(mode, name)
            medians[key] = record_rate(report, key, drains, transport(mode, ep))
    return medians


def record_rate(report: Report, key: str, drains: list[Drain], how: str) -> Drain:
    """The median run's figures (by rate): the rate, the rate after the first event, and
    the CPU over the first to last event (the server's whole-run CPU divided by that
    window: an upper bound)."""
    median = sorted(drains, key=lambda d: d.rate)[len(drains) // 2]
    report.figures[key] = round(median.rate)
    report.figures[f"{key}_after_first_event"] = round(median.steady_rate)
    report.detail("rates", f"{key}: runs {', '.join(drain_text(d) for d in drains)}; {how}")
    client_s = median.client_cpu_s - median.first_cpu_s
    usage = median.usage | {"server_cpu_s": median.steady_server_cpu_s}
    record_cpu(report, key, usage, median.steady_s, client_s)
    return median


def rate_key(mode: str, name: str) -> str:
    if mode == "reliable_poll_http":
        return "reliable_poll_ev_s_tidings_http"
    return f"{mode}_ev_s_{name}"


def transport(mode: str, ep: Endpoint) -> str:
    if mode == "reliable_push":
        return f"ReliableReceiver on {ep.push_url.split('//')[0]}//"
    what = "LIVE polls" if mode == "live" else "PollFace loop"
    return f"{what} on {ep.poll_url.split('//')[0]}// at {ep.poll_version}"


# -- the client's profile --------------------------------------------------------------------


def package_of(url: str) -> str:
    if "node_modules/" in url:
        rest = url.rsplit("node_modules/", 1)[1].split("/")
        return "/".join(rest[:2]) if rest[0].startswith("@") else rest[0]
    if url.startswith("node:") or not url:
        return "node"
    return Path(url).name


def profile_samples(prof_dir: Path) -> tuple[dict[int, Any], list[tuple[int, int, int]]]:
    """The newest .cpuprofile's nodes by id and its samples as (node id, time in us, us)."""
    files = sorted(prof_dir.glob("*.cpuprofile"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise RuntimeError(f"node --cpu-prof wrote no profile in {prof_dir}")
    data = json.loads(files[-1].read_text())
    samples, at = [], data["startTime"]
    for node_id, delta in zip(data["samples"], data["timeDeltas"], strict=False):
        at += delta
        samples.append((node_id, at, delta))
    return {node["id"]: node for node in data["nodes"]}, samples


def profile_summary(prof_dir: Path, start_us: int, first_us: int, top: int = 8) -> str:
    """Self time by package and the top functions of a profiled drain, apart from the
    client's start (after its modules are loaded) to the first event, and after it."""
    nodes, samples = profile_samples(prof_dir)
    parts: dict[str, tuple[Counter[str], Counter[str]]] = {
        "before": (Counter(), Counter()),
        "after": (Counter(), Counter()),
    }
    for node_id, at, delta in samples:
        frame = nodes[node_id]["callFrame"]
        name = frame["functionName"] or "(anonymous)"
        if name == "(idle)" or at < start_us:
            continue
        package = package_of(frame["url"])
        by_function, by_package = parts["after" if at >= first_us else "before"]
        by_function[f"{name} ({package}:{frame['lineNumber'] + 1})"] += delta
        by_package[package] += delta
    texts = []
    for part, (by_function, by_package) in parts.items():
        total = sum(by_package.values()) or 1
        functions = ", ".join(f"{k} {v / total:.0%}" for k, v in by_function.most_common(top))
        packages = ", ".join(f"{k} {v / total:.0%}" for k, v in by_package.most_common(6))
        texts.append(
            f"{part} the first event, {total / 1e6:.2f} CPU-s: by package {packages}; "
            f"top self time {functions}"
        )
    return "; ".join(texts)


def bound_note(key: str, drain: Drain) -> tuple[str, bool]:
    """What bounds one tidings drain, and whether the FutoIn client does (then it gets a
    profile): its start (before the first event) taking 30% of the drain or more at
    BOUND_SHARE of a core or more, or the delivery after it with the client that busy."""
    start_s = drain.first_ms / 1000
    start_core = drain.first_cpu_s / start_s if start_s else 0.0
    start_bound = start_core >= BOUND_SHARE and start_s >= 0.3 * drain.ms / 1000
    server_core = drain.steady_server_cpu_s / drain.steady_s
    if drain.steady_client_core >= BOUND_SHARE:
        delivery = "the FutoIn client bounds the delivery"
    elif server_core >= BOUND_SHARE:
        delivery = "tidings' server CPU (one Python process) bounds the delivery"
    else:
        delivery = "neither is CPU-bound there (round trips, database reads)"
    text = (
        f"{key} ({drain.rate:,.0f} ev/s): the FutoIn client's own start took "
        f"{drain.first_ms:,.0f} of {drain.ms:,.0f} ms, at {start_core:.0%} of a core (Node's "
        f"helper threads included){': the client bounds that part' if start_bound else ''}; "
        f"from the first to the last event ({drain.steady_rate:,.0f} ev/s) the server used "
        f"{server_core:.0%} of a core and the client {drain.steady_client_core:.0%}: {delivery}"
    )
    return text, start_bound or drain.steady_client_core >= BOUND_SHARE


def profile_bound_rates(
    servers: dict[str, tuple[Endpoint, Callable[[], int | None]]],
    medians: dict[str, Drain],
    markers: dict[str, int],
    sizes: Sizes,
    work: Path,
    report: Report,
) -> None:
    """Say what bounds each tidings rate; run those the FutoIn client bounds once more
    under ``node --cpu-prof`` and summarise the profile."""
    ep, pid_of = servers["tidings"]
    for mode in RATE_MODES:
        key = rate_key(mode, "tidings")
        drain = medians.get(key)
        if drain is None:
            continue
        text, client_bound = bound_note(key, drain)
        if not client_bound:
            report.note(f"what bounds {text}")
            continue
        prof_dir = work / f"prof-{mode}"
        say(f"  the FutoIn client bounds tidings {mode}: profiling it")
        profiled = drain_once(ep, pid_of(), mode, 9, sizes, markers["tidings"], prof_dir)
        report.note(
            f"what bounds {text}. `node --cpu-prof` of one more drain ({profiled.rate:,.0f} "
            "ev/s under the profiler): "
            f"{profile_summary(prof_dir, profiled.start_us, profiled.first_us)}"
        )


# -- phase (a): latency ----------------------------------------------------------------------


@dataclass
class Latency:
    p50: float
    p99: float
    maximum: float
    missing: int
    max_lag_ms: float
    text: str
    #: p99 of latency less the event's own addEvent round trip (what delivery adds)
    delivery_p99: float = 0.0
    #: p99 of addEvent's round trip
    rtt_p99: float = 0.0


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"p50 {percentile(values, 50):,.1f} / p99 {percentile(values, 99):,.1f} ms"


def latency_options(ep: Endpoint, consumer: str, rate: int, sizes: Sizes) -> dict[str, Any]:
    return {
        "mode": "latency",
        "consumer": consumer,
        "url": ep.poll_url,
        "version": ep.poll_version,
        "push_url": ep.push_url,
        "gen_url": ep.gen_url,
        "creds": CREDS,
        "component": f"LAT{consumer.upper()}{rate}",
        "type": FTN18_TYPE,
        "rate": rate,
        "seconds": sizes.latency_s,
        "wait_s": LATENCY_WAIT_S,
        "idle_ms": POLL_IDLE_MS,
    }


def latency_run(
    ep: Endpoint, pid: int | None, consumer: str, rate: int, sizes: Sizes, report: Report
) -> Latency:
    """One latency load through the FutoIn client (one generator connection)."""
    timeout = sizes.latency_s + LATENCY_WAIT_S + 30
    result = node_client(latency_options(ep, consumer, rate, sizes), pid, timeout)
    line = result.last("latencies")
    if line is None:
        raise RuntimeError(f"{ep.name} latency ({consumer}): no result: {result.problem()}")
    skip = int(sizes.warmup_s * rate)
    pairs = list(zip(line["latencies"][skip:], line["gen_rtt"][skip:], strict=True))
    kept = [lat for lat, _ in pairs if lat is not None]
    if not kept:
        raise RuntimeError(f"{ep.name} latency ({consumer}): no event arrived")
    missing = len(pairs) - len(kept)
    # An event still missing when the client gave up counts as its wait: a lower bound.
    kept += [(sizes.latency_s + LATENCY_WAIT_S) * 1000] * missing
    rtt = [r for _, r in pairs if r is not None]
    beyond = [lat - r for lat, r in pairs if lat is not None and r is not None]
    row = record_cpu(
        report,
        f"latency {rate}/s {ep.name} {consumer}",
        result.usage,
        result.usage["wall_s"],
        line["cpu_ms"] / 1000,
    )
    lat = Latency(
        percentile(kept, 50),
        percentile(kept, 99),
        max(kept),
        missing,
        line["max_lag_ms"],
        "",
        percentile(beyond, 99) if beyond else 0.0,
        percentile(rtt, 99) if rtt else 0.0,
    )
    lat.text = (
        f"{ep.name} {consumer} at {rate} ev/s offered: p50 {lat.p50:,.1f} ms, p99 "
        f"{lat.p99:,.1f} ms, max {lat.maximum:,.0f} ms over {len(kept):,} events ({missing} "
        f"missing after the wait, counted as it; {line['gen_errors']} addEvent errors, "
        f"generator's worst lateness "
        f"{lat.max_lag_ms:,.0f} ms); addEvent round trip {spread(rtt)}; latency less the "
        f"event's addEvent round trip {spread(beyond)}; server {row['server_cores']:.0%} of a "
        f"core, client {row['client_cores']:.0%}"
    )
    return lat


def phase_latency(
    servers: dict[str, tuple[Endpoint, Callable[[], int | None]]], sizes: Sizes, report: Report
) -> None:
    """Latency at RATE through one GenFace connection (as a user's generator has it), push
    and poll; the worse of the two per server is the figure."""
    for name, (ep, pid_of) in servers.items():
        results = {}
        for consumer in ("push", "poll"):
            lat = latency_run(ep, pid_of(), consumer, RATE, sizes, report)
            results[consumer] = lat
            say(f"  {lat.text}")
            report.detail("latency", lat.text)
            report.figures[f"latency_{consumer}_p50_ms_{name}"] = round(lat.p50, 2)
            report.figures[f"latency_{consumer}_p99_ms_{name}"] = round(lat.p99, 2)
            delivery = f"latency_{consumer}_delivery_p99_ms_{name}"
            report.figures[delivery] = round(lat.delivery_p99, 2)
            report.figures[f"latency_{consumer}_addevent_p99_ms_{name}"] = round(lat.rtt_p99, 2)
        worse = max(results.values(), key=lambda lat: lat.p99)
        report.figures[f"latency_p50_ms_{name}"] = round(worse.p50, 2)
        report.figures[f"latency_p99_ms_{name}"] = round(worse.p99, 2)


def latency_note(report: Report) -> None:
    """When tidings misses the latency goal: how much is addEvent's round trip (storing the
    event) and how much delivery after it, with the server's CPU meanwhile."""
    f = report.figures
    total = f.get("latency_p99_ms_tidings")
    if total is None or total <= 20:
        return
    parts = []
    for consumer in ("push", "poll"):
        rtt = f.get(f"latency_{consumer}_addevent_p99_ms_tidings")
        delivery = f.get(f"latency_{consumer}_delivery_p99_ms_tidings")
        cpu = [r for r in report.cpu if r["phase"] == f"latency {RATE}/s tidings {consumer}"]
        if rtt is None or delivery is None or not cpu:
            continue
        parts.append(
            f"{consumer}: addEvent's round trip p99 {rtt:,.1f} ms, delivery after the reply "
            f"p99 {delivery:,.1f} ms, server at {cpu[-1]['server_cores']:.0%} of a core"
        )
    report.note(
        f"tidings' latency at {RATE} ev/s (p99 {total:,.1f} ms, goal 20) splits into the "
        "generator's addEvent round trip (the event stored: a group commit in PostgreSQL "
        "through the server's single write thread) and delivery once stored: " + "; ".join(parts)
    )


def phase_latency_low(
    servers: dict[str, tuple[Endpoint, Callable[[], int | None]]], sizes: Sizes, report: Report
) -> None:
    """The same at LOW_RATE, under what one GenFace connection to tidings takes."""
    for name, (ep, pid_of) in servers.items():
        for consumer in ("push", "poll"):
            lat = latency_run(ep, pid_of(), consumer, LOW_RATE, sizes, report)
            say(f"  {lat.text}")
            report.detail("latency at a lower rate", lat.text)
            report.figures[f"latency_{consumer}_p99_ms_{name}_at_{LOW_RATE}"] = round(lat.p99, 2)


def phase_latency_sqlite(work: Path, sizes: Sizes, report: Report) -> None:
    """The latency once more with tidings on its embedded default, a SQLite file (no
    FutoIn equivalent): what a commit costs there against PostgreSQL's."""
    server, ep = tidings_server(work, f"sqlite:///{work / 'sqlite' / 'events.db'}")
    with running(server):
        results = {}
        for consumer in ("push", "poll"):
            lat = latency_run(
                ep, server.proc.pid if server.proc else None, consumer, RATE, sizes, report
            )
            results[consumer] = lat
            say(f"  SQLite: {lat.text}")
            report.detail("latency, tidings on SQLite", lat.text)
            for q, value in (("p50", lat.p50), ("p99", lat.p99)):
                report.figures[f"latency_{consumer}_{q}_ms_tidings_sqlite"] = round(value, 2)
        worse = max(results.values(), key=lambda lat: lat.p99)
        report.figures["latency_p50_ms_tidings_sqlite"] = round(worse.p50, 2)
        report.figures["latency_p99_ms_tidings_sqlite"] = round(worse.p99, 2)


# -- phase (b): tidings' Python consumer against a JetStream pull consumer -------------------


async def until_done(done: asyncio.Event, task: asyncio.Task[Any], timeout: float) -> None:
    """Wait for ``done``; the consumer task's error if it ends first, TimeoutError after
    ``timeout``."""
    waiter = asyncio.ensure_future(done.wait())
    try:
        finished, _ = await asyncio.wait(
            {waiter, task}, timeout=timeout, return_when="FIRST_COMPLETED"
        )
    finally:
        waiter.cancel()
    if task in finished:
        task.result()
        raise RuntimeError("the consumer stopped")
    if waiter not in finished:
        raise TimeoutError(f"not done after {timeout:g} s")


@contextlib.asynccontextmanager
async def consuming(
    url: str, component: str, handle: Callable[[StreamEvent], Any], on_ready: Any = None
) -> Any:
    """tidings' consume() (push) in a task, cancelled on leaving."""
    task = asyncio.create_task(consume(url, USER, PASSWORD, component, handle, on_ready=on_ready))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def python_drain(url: str, component: str, count: int) -> float:
    """Seconds tidings' consume() takes from its start to the ``count``-th event."""
    handled = 0
    done = asyncio.Event()

    async def handle(event: StreamEvent) -> None:
        nonlocal handled
        handled += 1
        if handled >= count:
            done.set()

    started = time.perf_counter()
    async with consuming(url, component, handle) as task:
        await until_done(done, task, 300)
        return time.perf_counter() - started


async def jetstream_fill(js: Any, count: int) -> None:
    """A marker message then ``count`` messages, the same JSON as the event data."""
    await js.add_stream(name=JS_STREAM, subjects=[JS_SUBJECT])
    await js.publish(JS_SUBJECT, json.dumps({"marker": True}).encode())
    for start in range(1, count + 1, 5000):
        acks = [
            await js.publish_async(JS_SUBJECT, json.dumps(event_data(i)).encode())
            for i in range(start, min(start + 5000, count + 1))
        ]
        await asyncio.gather(*acks)


async def jetstream_drain(js: Any, durable: str, count: int) -> float:
    """Seconds a new durable pull consumer takes to fetch, decode and acknowledge ``count``
    messages (batches of 1,000, the last of each acknowledged: AckPolicy.ALL)."""
    config = ConsumerConfig(ack_policy=AckPolicy.ALL)
    started = time.perf_counter()
    sub = await js.pull_subscribe(JS_SUBJECT, durable=durable, stream=JS_STREAM, config=config)
    got = 0
    while got < count:
        msgs = await sub.fetch(1000, timeout=5)
        for msg in msgs:
            json.loads(msg.data)
        await msgs[-1].ack()
        got += len(msgs)
    elapsed = time.perf_counter() - started
    await sub.unsubscribe()
    return elapsed


async def phase_drains(
    tidings_url: str, tidings_pid: int, js: Any, nats_pid: int, sizes: Sizes, report: Report
) -> None:
    """Both consumers drain the same number of events, runs interleaved; the medians."""
    count = sizes.py_events + 1
    runs: dict[str, list[tuple[float, dict[str, float]]]] = {"python": [], "jetstream": []}
    for run in range(1, sizes.py_runs + 1):
        usage = Usage(tidings_pid)
        seconds = await python_drain(tidings_url, f"PYDRAIN{run}", count)
        runs["python"].append((seconds, usage.stop()))
        usage = Usage(nats_pid)
        seconds = await jetstream_drain(js, f"drain{run}", count)
        runs["jetstream"].append((seconds, usage.stop()))
        say(
            f"  run {run}: tidings consume() {count / runs['python'][-1][0]:,.0f} ev/s, "
            f"JetStream pull {count / runs['jetstream'][-1][0]:,.0f} ev/s"
        )
    for name, key, client in (
        ("python", "python_consume_ev_s", "the Python consumer"),
        ("jetstream", "jetstream_pull_ev_s", "the nats-py consumer"),
    ):
        seconds, usage = sorted(runs[name])[len(runs[name]) // 2]
        report.figures[key] = round(count / seconds)
        rates = ", ".join(f"{count / s:,.0f}" for s, _ in runs[name])
        report.detail("python", f"{key}: {count:,} events per run; runs {rates} ev/s")
        record_cpu(report, key, usage, seconds, usage["bench_cpu_s"], client)


async def paced(send: Callable[[int], Any], rate: int, seconds: float) -> float:
    """Call ``send(i)`` for i = 0, 1, ... at ``rate`` per second; the worst lateness (ms)."""
    total = int(rate * seconds)
    started = time.perf_counter()
    sent, lag = 0, 0.0
    while sent < total:
        due = min(total, int((time.perf_counter() - started) * rate) + 1)
        if due > sent:
            lag = max(lag, (time.perf_counter() - started - sent / rate) * 1000)
        while sent < due:
            await send(sent)
            sent += 1
        await asyncio.sleep(0.001)
    return lag


def now_ms() -> float:
    return time.time() * 1000


class Latencies:
    """Receive time - data.t of each event i of a paced load."""

    def __init__(self, total: int) -> None:
        self.values: list[float | None] = [None] * total
        self.sent_at: list[float] = [0.0] * total
        self.rtt: list[float | None] = [None] * total
        self.got = 0
        self.done = asyncio.Event()

    def sending(self, i: int) -> float:
        self.sent_at[i] = now_ms()
        return self.sent_at[i]

    def replied(self, i: int) -> None:
        """The producer's call for event i was answered (tidings' addEvent, JetStream's
        PubAck)."""
        if 0 <= i < len(self.rtt):
            self.rtt[i] = now_ms() - self.sent_at[i]

    def seen(self, data: Any) -> None:
        if isinstance(data, dict) and "t" in data and self.values[data["i"]] is None:
            self.values[data["i"]] = now_ms() - data["t"]
            self.got += 1
            if self.got == len(self.values):
                self.done.set()

    async def finish(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.done.wait(), timeout)


async def open_generators(url: str, count: int, lat: Latencies) -> list[Any]:
    conns = [await websockets.connect(url, compression=None) for _ in range(count)]
    for ws in conns:
        asyncio.get_running_loop().create_task(read_replies(ws, lat))
    return conns


async def read_replies(ws: Any, lat: Latencies) -> None:
    """Time the addEvent replies (rid C<i + 1>); an error reply leaves its event missing."""
    with contextlib.suppress(websockets.ConnectionClosed):
        async for frame in ws:
            reply = json.loads(frame)
            if "r" in reply and str(reply.get("rid", "")).startswith("C"):
                lat.replied(int(reply["rid"][1:]) - 1)


async def python_latency(url: str, sizes: Sizes) -> tuple[Latencies, float]:
    """tidings' consume() (push) with events generated by addEvent over PY_GEN_CONNS
    WebSockets at RATE; starts after a marker so that no backlog is read."""
    lat = Latencies(int(RATE * sizes.latency_s))
    ready = asyncio.Event()
    async with StreamClient(url, USER, PASSWORD) as client:
        marker = await client.add_event(FTN18_TYPE, {"marker": True})
        await client.register("PYLAT")
        await client.poll("PYLAT", marker)
    conns = await open_generators(url.replace("http", "ws", 1), PY_GEN_CONNS, lat)

    async def send(i: int) -> None:
        message = {
            "f": "futoin.evt.gen:1.1:addEvent",
            "p": {"type": FTN18_TYPE, "data": {"t": lat.sending(i), "i": i}},
            "rid": f"C{i + 1}",
            "sec": CREDS,
        }
        await conns[i % len(conns)].send(json.dumps(message))

    async def handle(event: StreamEvent) -> None:
        lat.seen(event.data)

    try:
        async with consuming(url, "PYLAT", handle, on_ready=ready.set):
            await asyncio.wait_for(ready.wait(), 30)
            lag = await paced(send, RATE, sizes.latency_s)
            await lat.finish(30)
    finally:
        for ws in conns:
            await ws.close()
    return lat, lag


async def jetstream_latency(js: Any, sizes: Sizes) -> tuple[Latencies, float]:
    """A durable pull consumer from the newest message on (fetch batches of 1,000) with
    messages published (js.publish, acknowledged, not awaited in turn) at RATE."""
    lat = Latencies(int(RATE * sizes.latency_s))
    config = ConsumerConfig(ack_policy=AckPolicy.ALL, deliver_policy=DeliverPolicy.NEW)
    sub = await js.pull_subscribe(JS_SUBJECT, durable="latency", stream=JS_STREAM, config=config)
    pending: set[asyncio.Task[Any]] = set()

    async def fetch_loop() -> None:
        while not lat.done.is_set():
            try:
                msgs = await sub.fetch(1000, timeout=1)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            for msg in msgs:
                lat.seen(json.loads(msg.data))
            await msgs[-1].ack()

    async def send(i: int) -> None:
        payload = json.dumps({"t": lat.sending(i), "i": i}).encode()
        task = asyncio.create_task(js.publish(JS_SUBJECT, payload))
        task.add_done_callback(
            lambda t, i=i: None if t.cancelled() or t.exception() else lat.replied(i)
        )
        pending.add(task)
        task.add_done_callback(pending.discard)

    fetching = asyncio.create_task(fetch_loop())
    try:
        lag = await paced(send, RATE, sizes.latency_s)
        await lat.finish(30)
    finally:
        fetching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fetching
    return lat, lag


def record_latency(
    report: Report, key: str, lat: Latencies, lag: float, usage: dict[str, float], sizes: Sizes
) -> None:
    skip = int(sizes.warmup_s * RATE)
    values = lat.values[skip:]
    kept = [v for v in values if v is not None]
    if not kept:
        raise RuntimeError(f"{key}: no event arrived")
    rtt = [r for r in lat.rtt[skip:] if r is not None]
    beyond = [v - r for v, r in zip(values, lat.rtt[skip:], strict=True) if v and r]
    if beyond:
        report.figures[f"{key}_latency_delivery_p99_ms"] = round(percentile(beyond, 99), 2)
    p50, p99 = percentile(kept, 50), percentile(kept, 99)
    report.figures[f"{key}_latency_p50_ms"] = round(p50, 2)
    report.figures[f"{key}_latency_p99_ms"] = round(p99, 2)
    row = record_cpu(
        report,
        f"{key} latency",
        usage,
        usage["wall_s"],
        usage["bench_cpu_s"],
        "the benchmark process",
    )
    text = (
        f"{key} at {RATE} ev/s offered: p50 {p50:,.1f} ms, p99 {p99:,.1f} ms, max {max(kept):,.0f}"
        f" ms over {len(kept):,} events ({len(values) - len(kept)} missing; producer's worst "
        f"lateness {lag:,.0f} ms); the producer's call answered after {spread(rtt)}; latency "
        f"less that {spread(beyond)} (negative: the event arrived before the reply); server "
        f"{row['server_cores']:.0%} of a core, benchmark process (producer and consumer) "
        f"{row['client_cores']:.0%}"
    )
    say(f"  {text}")
    report.detail("python", text)


async def part_b_async(
    tidings_url: str,
    tidings_pid: int,
    nats_url: str,
    nats_pid: int,
    sizes: Sizes,
    report: Report,
) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        say(f"  publishing {sizes.py_events + 1:,} JetStream messages ...")
        await jetstream_fill(js, sizes.py_events)
        await phase_drains(tidings_url, tidings_pid, js, nats_pid, sizes, report)
        usage = Usage(tidings_pid)
        lat, lag = await python_latency(tidings_url, sizes)
        record_latency(report, "python_consume", lat, lag, usage.stop(), sizes)
        usage = Usage(nats_pid)
        lat, lag = await jetstream_latency(js, sizes)
        record_latency(report, "jetstream_pull", lat, lag, usage.stop(), sizes)
    finally:
        await nc.close()


# -- goals and report ------------------------------------------------------------------------

GOALS: dict[str, dict[str, Any]] = {
    "reliable_push_ev_s_tidings": {"min_ratio": 3.0, "of": "reliable_push_ev_s_futoin"},
    "reliable_poll_ev_s_tidings": {"min_ratio": 3.0, "of": "reliable_poll_ev_s_futoin"},
    "live_ev_s_tidings": {"min_ratio": 3.0, "of": "live_ev_s_futoin"},
    "python_consume_ev_s": {"min_ratio": 1.0, "of": "jetstream_pull_ev_s"},
    "latency_p99_ms_tidings": {"max": 20.0},
    "python_consume_latency_p99_ms": {"max": 20.0},
}


def shown(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f} {unit}" if unit == "ev/s" else f"{value:,.1f} {unit}"


def row(
    label: str,
    theirs: float | None,
    ours: float | None,
    unit: str,
    goal_key: str | None,
    met: dict[str, bool],
) -> str:
    ratio = f"{ours / theirs:.2f} x" if ours is not None and theirs else "-"
    goal, ok = "", ""
    if goal_key is not None:
        spec = GOALS[goal_key]
        goal = f"<= {spec['max']:g} ms" if "max" in spec else f">= {spec['min_ratio']:g} x"
        ok = "yes" if met[goal_key] else "**no**"
    return f"| {label} | {shown(theirs, unit)} | {shown(ours, unit)} | {ratio} | {goal} | {ok} |"


def pair(label: str, f: dict[str, float | None], key: str, unit: str, met: dict[str, bool]) -> str:
    """One row of (a): ``key`` names the tidings figure; FutoIn's is the same with futoin."""
    theirs = f.get(key.replace("tidings", "futoin"))
    return row(label, theirs, f.get(key), unit, key if key in GOALS else None, met)


def table_a(f: dict[str, float | None], met: dict[str, bool]) -> list[str]:
    lines = [
        "| measure | FutoIn | tidings | ratio | goal | met |",
        "|---|---:|---:|---:|---|:---:|",
    ]
    labels = {
        "reliable_push": "reliable push (ReliableReceiver)",
        "reliable_poll": "reliable poll (PollFace loop, WebSocket)",
        "live": "live (LIVE polls, WebSocket)",
    }
    for mode, label in labels.items():
        lines.append(pair(label, f, f"{mode}_ev_s_tidings", "ev/s", met))
    for mode, label in labels.items():
        after = f"{mode}_ev_s_tidings_after_first_event"
        lines.append(pair(f"{label}, first to last event", f, after, "ev/s", met))
    lines.append(
        pair(
            "reliable poll over HTTP (tidings only)",
            f,
            "reliable_poll_ev_s_tidings_http",
            "ev/s",
            met,
        )
    )
    for q in ("p50", "p99"):
        label = f"latency {q} at {RATE} ev/s (worse of push/poll)"
        lines.append(pair(label, f, f"latency_{q}_ms_tidings", "ms", met))
    for consumer in ("push", "poll"):
        for q in ("p50", "p99"):
            key = f"latency_{consumer}_{q}_ms_tidings"
            lines.append(pair(f"latency {q}, {consumer}, at {RATE} ev/s", f, key, "ms", met))
    for consumer in ("push", "poll"):
        key = f"latency_{consumer}_delivery_p99_ms_tidings"
        label = f"latency p99 less addEvent's round trip, {consumer}, at {RATE} ev/s"
        lines.append(pair(label, f, key, "ms", met))
    for consumer in ("push", "poll"):
        key = f"latency_{consumer}_p99_ms_tidings_at_{LOW_RATE}"
        lines.append(pair(f"latency p99, {consumer}, at {LOW_RATE} ev/s", f, key, "ms", met))
    for consumer in ("push", "poll"):
        for q in ("p50", "p99"):
            key = f"latency_{consumer}_{q}_ms_tidings_sqlite"
            label = f"latency {q}, {consumer}, at {RATE} ev/s, tidings on SQLite (its default)"
            lines.append(pair(label, f, key, "ms", met))
    return lines


def table_b(f: dict[str, float | None], met: dict[str, bool]) -> list[str]:
    return [
        "| measure | JetStream (nats-py pull) | tidings (Python consume) | ratio | goal | met |",
        "|---|---:|---:|---:|---|:---:|",
        row(
            "drain",
            f.get("jetstream_pull_ev_s"),
            f.get("python_consume_ev_s"),
            "ev/s",
            "python_consume_ev_s",
            met,
        ),
        row(
            f"latency p50 at {RATE} ev/s",
            f.get("jetstream_pull_latency_p50_ms"),
            f.get("python_consume_latency_p50_ms"),
            "ms",
            None,
            met,
        ),
        row(
            f"latency p99 at {RATE} ev/s",
            f.get("jetstream_pull_latency_p99_ms"),
            f.get("python_consume_latency_p99_ms"),
            "ms",
            "python_consume_latency_p99_ms",
            met,
        ),
        row(
            "latency p99 less the producer call's round trip",
            f.get("jetstream_pull_latency_delivery_p99_ms"),
            f.get("python_consume_latency_delivery_p99_ms"),
            "ms",
            None,
            met,
        ),
    ]


def cpu_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| phase | window s | server (cores) | PostgreSQL (cores) | client (cores) "
        "| other processes (share of all cores) | what bounds it |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['phase']} | {r['window_s']:.2f} | {r['server_cores']:.2f} | "
            f"{r['postgres_cores']:.2f} | {r['client_cores']:.2f} | {r['other_share']:.0%} | "
            f"{r['bound']} |"
        )
    return lines


def write_markdown(result: dict[str, Any], report: Report, quick: bool) -> str:
    machine = result["machine"]
    f, met = report.figures, result["met"]
    lines = [
        "# tidings streams benchmark (FTN18)",
        "",
        f"Run `.venv/bin/python bench/streams.py{' --quick' if quick else ''}` on "
        f"{machine['date']}, {result['runtime_min']:.1f} min.",
        "",
        f"Machine: {machine_text(machine)}; Python {machine['python']}, Node "
        f"{machine['node']}, PostgreSQL {machine['postgresql']}, nats-server "
        f"{machine['nats_server']}.",
        "",
        "## (a) tidings vs FutoIn's own server, both driven by the FutoIn client",
        "",
        *table_a(f, met),
        "",
        "Ratio: tidings / FutoIn (for latencies, above 1 means tidings is slower).",
        "",
        "## (b) tidings' Python consumer vs a NATS JetStream durable pull consumer",
        "",
        *table_b(f, met),
        "",
        "## CPU per phase",
        "",
        "Cores used over each phase's window: for a drain of (a), its median run from the "
        "first to the last event (the server's CPU sampled every 5 ms; PostgreSQL's CPU of "
        "the whole run divided by that window: an upper bound); otherwise the whole run. "
        "The client is the FutoIn "
        "client's Node process in (a) and the benchmark process itself in (b). Other "
        "processes: the machine's busy time less the server, PostgreSQL and the clients, over "
        "the whole run, as a share of all cores.",
        "",
        *cpu_table(report.cpu),
        "",
        "## Notes",
        "",
        *[f"- {note}" for note in report.notes],
        "",
        "## Details",
        "",
    ]
    for section, items in report.details.items():
        lines += [f"### {section}", "", *[f"- {item}" for item in items], ""]
    return "\n".join(lines)


# -- running it ------------------------------------------------------------------------------


def measured(name: str, fn: Callable[[], Any], report: Report) -> Any:
    """Run one phase, noting a failure instead of ending the run."""
    say(f"{name} ...")
    try:
        return fn()
    except Exception as exc:
        traceback.print_exc()
        report.note(f"{name} failed: {type(exc).__name__}: {exc}")
        return None


def part_a(work: Path, sizes: Sizes, report: Report, stack: contextlib.ExitStack) -> None:
    pid = os.getpid()
    tidings_url = stack.enter_context(scratch_database(f"bench_streams_t{pid}"))
    futoin_db = f"bench_streams_f{pid}"
    futoin_url = stack.enter_context(scratch_database(futoin_db))
    say(f"(a) filling both stores with a marker and {sizes.backlog:,} events ...")
    markers = {
        "tidings": fill_tidings(tidings_url, sizes.backlog),
        "futoin": fill_futoin(futoin_url, sizes.backlog),
    }
    server, endpoint = tidings_server(work, tidings_url)
    stack.enter_context(running(server))
    futoin = FutoInServer(work, futoin_db)
    stack.callback(futoin.stop)
    futoin.ensure()

    def futoin_pid() -> int | None:
        futoin.ensure()
        return futoin.pid

    servers = {
        "tidings": (endpoint, lambda: server.proc.pid if server.proc else None),
        "futoin": (futoin.endpoint, futoin_pid),
    }
    medians = measured("(a) rates", lambda: phase_rates(servers, markers, sizes, report), report)
    if medians:
        measured(
            "(a) profile of client-bound rates",
            lambda: profile_bound_rates(servers, medians, markers, sizes, work, report),
            report,
        )
    measured("(a) latency", lambda: phase_latency(servers, sizes, report), report)
    latency_note(report)
    measured(
        f"(a) latency at {LOW_RATE} ev/s", lambda: phase_latency_low(servers, sizes, report), report
    )
    measured(
        "(a) latency, tidings on SQLite", lambda: phase_latency_sqlite(work, sizes, report), report
    )
    report.note(
        "FutoIn's server exits when a consumer leaves with an onEvents call unanswered "
        "(uncaught CommError in futoin-executor's WSChannelContext._cleanup), so the drains "
        "let the client acknowledge the last group before it leaves (linger_ms) and the "
        "benchmark starts the server again when it died: "
        + ("it ran throughout" if futoin.starts == 1 else f"it was started {futoin.starts} times")
    )


def part_b(work: Path, sizes: Sizes, report: Report, stack: contextlib.ExitStack) -> None:
    url = stack.enter_context(scratch_database(f"bench_streams_p{os.getpid()}"))
    say(f"(b) filling tidings' store with a marker and {sizes.py_events:,} events ...")
    fill_tidings(url, sizes.py_events)
    server, endpoint = tidings_server(work, url)
    stack.enter_context(running(server))
    nats_server = NatsServer(free_port(), work / "nats")
    nats_server.start()
    stack.callback(nats_server.kill)
    nats_pid = nats_server._proc.pid  # type: ignore[union-attr]
    assert server.proc is not None
    tidings_pid = server.proc.pid
    stream_url = "http" + endpoint.poll_url[2:]
    measured(
        "(b) Python consumer vs JetStream",
        lambda: asyncio.run(
            part_b_async(stream_url, tidings_pid, nats_server.url, nats_pid, sizes, report)
        ),
        report,
    )


def method_notes(sizes: Sizes) -> list[str]:
    return [
        f"(a) rates: a backlog of {sizes.backlog:,} events (plus one marker event) in each "
        "server's PostgreSQL store, drained by the FutoIn client (futoin-eventstream 1.3.9) "
        f"with a new component per run; events/s = events / (client start to last event), "
        f"median of {sizes.runs} runs, tidings and FutoIn runs interleaved. Reliable and "
        "LIVE drains read the same events; LIVE polls start after the marker (last_id "
        "cannot be 0 on the wire).",
        "(a) transports: FutoIn's server serves poll only at 1.0 and only over WebSocket "
        "once push is served, so its PollFace runs over ws:// at 1.0; tidings' PollFace runs "
        "over ws:// at 1.1 (the figure) and over http:// at 1.1 (a diagnostic row). Pushes "
        "and addEvent use secure+ws:// on both (secure_channel / secureChannel).",
        f"(a) latency: GenFace.addEvent at {RATE} events/s for {sizes.latency_s:g} s with "
        "data.t = send time, calls not awaited in turn, over one generator connection (a "
        "GenFace as a user registers it), the consumer in the same Node process "
        f"(ReliableReceiver, or a PollFace loop waiting {POLL_IDLE_MS} ms after an empty poll); "
        f"the first {sizes.warmup_s:g} s are left out. The figure is the worse of push and "
        f"poll by p99. The same runs once more at {LOW_RATE} events/s (rows 'at "
        f"{LOW_RATE} ev/s'). Each text in Details also gives addEvent's round trip and the "
        "latency less the event's own addEvent round trip (what delivery adds once the "
        "generator has its reply).",
        f"(b) both consumers drain {sizes.py_events + 1:,} events (median of {sizes.py_runs}); "
        "the JetStream consumer is durable, fetches batches of 1,000 and acknowledges the "
        "last of each (AckPolicy.ALL), the tidings consumer is consume() with push (one "
        f"acknowledgement per group). Latency: {RATE} events/s for {sizes.latency_s:g} s, "
        f"produced in the benchmark process (tidings: addEvent over {PY_GEN_CONNS} WebSockets; "
        "JetStream: js.publish), consumed in the same process.",
        "Both servers keep their events in PostgreSQL 15 on this machine; FutoIn's server "
        "uses futoin-database's AutoConfig with DB_EVT_MAXCONN=1 (its default).",
    ]


def versions() -> dict[str, str]:
    def first_line(*command: str) -> str:
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=30)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError) as exc:
            return f"unknown ({exc})"

    with psycopg.connect(f"{PG}/postgres") as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return {
        "node": first_line("node", "--version"),
        "postgresql": str(row[0]) if row else "unknown",
        "nats_server": first_line("/usr/sbin/nats-server", "--version"),
    }


def build_result(machine: dict[str, Any], report: Report, runtime: float) -> dict[str, Any]:
    result: dict[str, Any] = {"machine": machine}
    result.update(report.figures)
    result["goals"] = GOALS
    result["met"] = goals_met(report.figures, GOALS)
    result["cpu"] = report.cpu
    result["notes"] = report.notes
    result["details"] = report.details
    result["runtime_min"] = round(runtime / 60, 2)
    return result


def load_notes(report: Report) -> None:
    loaded = [r for r in report.cpu if r["other_share"] > LOADED_SHARE]
    if loaded:
        names = ", ".join(f"{r['phase']} {r['other_share']:.0%}" for r in loaded)
        report.note(
            f"other processes used over {LOADED_SHARE:.0%} of the cores during: {names}; "
            "those figures are lower/slower than on an idle machine"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under 3 minutes")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    work = Path(tempfile.mkdtemp(prefix="tidings-bench-streams-"))
    report = Report()
    say(f"tidings streams benchmark ({'quick' if args.quick else 'full'}), work dir {work}")
    machine = machine_info(spark=False) | versions()
    code = code_version()
    say(f"machine: {machine}; code: {code}")
    report.notes += [f"code measured: {code}", *method_notes(sizes)]
    if args.quick:
        report.notes.insert(0, "--quick run: smaller sizes, fewer runs")
    try:
        for part in (part_a, part_b):
            with contextlib.ExitStack() as stack:
                part(work, sizes, report, stack)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_notes(report)
    result = build_result(machine, report, runtime_s())
    paths = write_report("streams", result, write_markdown(result, report, args.quick))
    say(f"done in {runtime_s() / 60:.1f} min; met: {result['met']}")
    say(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
