"""How long a standby relay takes to publish again after the active relay dies, step by step.

Run ``.venv/bin/python -m bench.relay_takeover [--quick]`` from the checkout. For each outbox
database (a SQLite file, then a scratch PostgreSQL database on :5432), two ``tidings relay``
processes run on one configuration (one outbox, one checkpoint, the default lease timings),
publishing to a ``tidings server`` process through an ``event_server`` target, while a
producer commits one event per transaction at a steady rate over a few keys. The active relay
is SIGKILLed (its whole process group, JVM included) ``kills`` times, each time after the
standby announced itself and publishing ran steadily for a while; the killed relay is started
again, as a supervisor would, and becomes the next standby; each kill waits until the standby
is warm (:mod:`tidings.pipeline.warmup`: its warm-up's first batch recorded, ``warmed_s``
after it stood by).

Each takeover is timed from the kill, by the new relay's log lines (JSON, millisecond stamps),
by the target's store and by the outbox:

* ``lease``: the standby logs ``relay lease taken``;
* ``query``: it logs ``relay started`` (its streaming query is started);
* ``planned``: it logs ``relay first batch planned`` (the first micro-batch's offsets are in
  the checkpoint and its job is about to run);
* ``target``: the server stored its first event after the lease was taken (the server's
  timestamp; an event the dead relay sent may still be stored just after the kill);
* ``published``: the outbox's PUBLISHED count grew after the lease was taken (polled every
  0.1 s or so): publishing again (the dead relay's orphaned Python workers may record the
  chunk they were sending just after the kill);
* ``recorded``: it logs ``relay first batch recorded`` (the first batch's tasks all ended).

Afterwards the server's store must hold every committed event once, each key's in log order,
and every outbox row must be PUBLISHED. Writes ``bench/results/relay_takeover.json`` and
``.md``, with the machine and the CPU other processes used meanwhile (a loaded machine
slows every step).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from bench.harness.databases import scratch_database
from bench.harness.machine import code_version, machine_info
from bench.harness.markdown import bullets, command, heading, section, table
from bench.harness.outbox import status_counts
from bench.harness.processes import ServerProcess, free_port, kill_tree, tidings_cli
from bench.harness.producer import PacedProducer
from bench.harness.progress import runtime_s, say
from bench.harness.report import write_report
from bench.harness.sizes import Scale, Sizes, arguments, mode
from bench.harness.trees import TreeMonitor
from tidings.db import make_engine
from tidings.events.model import StoredEvent
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event
from tidings.server.store import EventStore

KEYS = 20
EVENT_TYPE = "Moved"
#: The steps of a takeover, in the order they happen, and what each is in the report.
STEPS = {
    "lease": "lease taken",
    "query": "query started",
    "planned": "first batch planned",
    "target": "first event stored at the target",
    "published": "first outbox row PUBLISHED",
    "recorded": "first batch recorded",
}
#: The new relay's log line that marks each step it logs.
_LOGGED = {
    "lease": "relay lease taken",
    "query": "relay started",
    "planned": "relay first batch planned",
    "recorded": "relay first batch recorded",
}
#: How each step is seen, for the report.
_MEANING = {
    "lease": "the standby logs `relay lease taken`",
    "query": "it logs `relay started` (its streaming query started)",
    "planned": "it logs `relay first batch planned` (the first micro-batch is in the "
    "checkpoint's offsets and its job about to run)",
    "target": "the server's timestamp of the first event it stored after the lease was taken",
    "published": "the outbox's PUBLISHED count grew after the lease was taken (polled): "
    "publishing again",
    "recorded": "it logs `relay first batch recorded` (the first batch's tasks all ended)",
}
_WAIT_S = 300.0
#: What a standby logs once its warm-up ran (:mod:`tidings.pipeline.warmup`).
_WARM = "standby warm-up first batch recorded"


@dataclass(frozen=True)
class TakeoverSizes(Sizes):
    """The producer's rate, the takeovers per database and the steady traffic before each."""

    rate: int  # events per second committed throughout
    kills: int  # takeovers measured per database
    steady_s: float  # publishing steadily, the standby announced, before each kill


SCALE = Scale(full=TakeoverSizes(100, 3, 15.0), quick=TakeoverSizes(50, 1, 5.0))


class RelayProcess:
    """One ``tidings relay`` process, started again at will, logging at INFO to a file of
    its own per start."""

    def __init__(self, name: str, config: Path) -> None:
        self.name, self.config = name, config
        self.starts = 0
        self.log = config.parent / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.starts += 1
        self.log = self.config.parent / f"{self.name}-{self.starts}.log"
        with self.log.open("wb") as out:
            self.proc = tidings_cli(
                *("--log-level", "INFO", "relay", "--config", str(self.config)),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the JVM dies with it
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_tree(self.proc)

    def stop(self) -> None:
        """SIGTERM (the relay stops between two batches), SIGKILL after 60 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc)

    def records(self) -> Iterator[tuple[float, dict[str, Any]]]:
        """Its JSON log records, with their stamps as epoch seconds."""
        for line in self.log.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
                yield datetime.fromisoformat(record["ts"]).timestamp(), record
            except (ValueError, KeyError):
                continue

    def logged(self, message: str, after: float = 0.0) -> tuple[float, dict[str, Any]] | None:
        """When it first logged ``message`` after ``after`` (epoch s), and the record."""
        return next(
            ((t, r) for t, r in self.records() if r.get("msg") == message and t > after), None
        )

    def says(self, text: str) -> bool:
        return text in self.log.read_text(errors="replace")

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


def wait_for(what: str, done: Callable[[], bool], explain: Callable[[], str]) -> None:
    """Until ``done()``; a RuntimeError naming ``what``, with ``explain()``, after
    :data:`_WAIT_S`."""
    deadline = time.monotonic() + _WAIT_S
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {_WAIT_S:g} s\n{explain()}")
        time.sleep(0.1)


class Rig:
    """For one database: the server, the two relays on one configuration, the producer."""

    def __init__(self, work: Path, database_url: str, rate: int) -> None:
        self.server = ServerProcess.tidings(work / "server", 1, {"eventer": free_port()})
        self.store_url = f"sqlite:///{work / 'server' / 'ev.db'}"
        target = {"kind": "event_server", "address": self.server.eventer, "type_prefix": ["t"]}
        config = {
            "database": {"url": database_url},
            "targets": {"server": target},
            "routing": {"routes": {EVENT_TYPE: ["server"]}},
            "relay": {"checkpoint_dir": str(work / "checkpoint"), "replay_every": None},
        }
        path = work / "tidings.yaml"
        path.write_text(json.dumps(config))  # JSON is YAML
        self.relays = [RelayProcess("relay-a", path), RelayProcess("relay-b", path)]
        self.engine = make_engine(database_url)
        self.producer = PacedProducer(Outbox(self.engine), rate, KEYS, EVENT_TYPE)

    def published(self) -> int:
        return status_counts(self.engine).get("PUBLISHED", 0)

    def start(self) -> None:
        self.server.start()
        first, second = self.relays
        first.start()
        wait_for("the first relay active", lambda: first.says("relay active"), first.tail)
        second.start()
        wait_for("the second relay standing by", lambda: second.says("standing by"), second.tail)
        self.producer.start()

    def stop(self) -> None:
        self.producer.stop.set()
        for relay in self.relays:
            relay.stop()
        self.server.stop()
        self.engine.dispose()


def takeover(
    rig: Rig, active: RelayProcess, standby: RelayProcess, steady_s: float, rng: random.Random
) -> dict[str, float | None]:
    """Once ``standby`` is warm and publishing ran steadily for ``steady_s``, SIGKILL
    ``active`` (at a random moment between two lease renewals) and time each step of
    ``standby``'s takeover (seconds from the kill); then start ``active`` again, the next
    standby. Also how long the standby took to be warm (``warmed_s``)."""
    wait_for("the standby warm", lambda: _warmed(standby) is not None, standby.tail)
    time.sleep(steady_s)
    before = rig.published()
    wait_for("steady publishing", lambda: rig.published() > before, active.tail)
    time.sleep(rng.uniform(0, 1))
    killed = time.time()
    active.kill()
    say(f"  {active.name} killed")
    watch = PublishedWatch(rig)
    lease_message, recorded = _LOGGED["lease"], _LOGGED["recorded"]

    def published_again() -> bool:
        watch.sample()
        lease = standby.logged(lease_message, killed)
        grown = lease is not None and watch.grew_after(lease[0]) is not None
        return grown and standby.logged(recorded, killed) is not None

    wait_for("publishing again", published_again, standby.tail)
    steps: dict[str, float | None] = {}
    for step, message in _LOGGED.items():
        found = standby.logged(message, killed)
        steps[step] = None if found is None else found[0]
    lease = steps["lease"]
    assert lease is not None
    steps["published"] = watch.grew_after(lease)
    wait_for("stored", lambda: first_stored_after(rig.store_url, lease) is not None, standby.tail)
    steps["target"] = first_stored_after(rig.store_url, lease)
    taken = {k: None if t is None else round(t - killed, 2) for k, t in steps.items()}
    taken["warmed_s"] = _warmed(standby)
    say(f"  {standby.name} took over: " + ", ".join(f"{k} {v} s" for k, v in taken.items()))
    active.start()
    return {name: taken[name] for name in (*STEPS, "warmed_s")}


class PublishedWatch:
    """The outbox's PUBLISHED count over time, to tell when the new relay published: the
    dead relay's Python workers, orphaned, may still record the chunk they were sending for
    a moment after the kill, so only growth after the lease was taken counts."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.samples: list[tuple[float, int]] = []

    def sample(self) -> None:
        self.samples.append((time.time(), self.rig.published()))

    def grew_after(self, moment: float) -> float | None:
        """The first sample after ``moment`` above the count at ``moment``, if any."""
        before = [count for at, count in self.samples if at <= moment]
        if not before:
            return None
        return next((at for at, count in self.samples if at > moment and count > before[-1]), None)


def _warmed(standby: RelayProcess) -> float | None:
    """Seconds from ``standby`` standing by until its warm-up's first batch was recorded
    (its log says), once it was; -1 if its preparation failed (it then starts cold)."""
    if standby.says("preparing the takeover failed"):
        return -1.0
    began, warm = standby.logged("relay standing by"), standby.logged(_WARM)
    return None if began is None or warm is None else round(warm[0] - began[0], 2)


def stored(store_url: str) -> list[StoredEvent]:
    """Every event in the server's store, in its order."""
    store = EventStore(store_url)
    try:
        events: list[StoredEvent] = []
        while batch := store.read(events[-1].position if events else 0, 10_000):
            events += batch
        return events
    finally:
        store.close()


def first_stored_after(store_url: str, after: float) -> float | None:
    """When the server stored its first event after ``after`` (its timestamp, epoch s)."""
    stamps = [e.timestamp_us / 1e6 for e in stored(store_url)]
    return min((t for t in stamps if t > after), default=None)


def delivery(rig: Rig) -> dict[str, Any]:
    """The server's store against the outbox: every event once, each key's in log order,
    every row PUBLISHED."""
    query = select(outbox_event.c.event_id, outbox_event.c.status).order_by(outbox_event.c.seq)
    with rig.engine.connect() as conn:
        rows = conn.execute(query).all()
    delivered = [e.outbox_event_id for e in stored(rig.store_url) if e.outbox_event_id]
    order = [r.event_id for r in rows]
    rank = {event_id: n for n, event_id in enumerate(order)}
    last: dict[str, int] = {}
    in_order = True
    for event_id in delivered:
        key = rig.producer.keys.get(event_id)
        if key is not None:
            in_order = in_order and rank[event_id] > last.get(key, -1)
            last[key] = rank[event_id]
    return {
        "events": len(order),
        "exactly_once": sorted(delivered) == sorted(order),
        "per_key_order": in_order,
        "all_published": {r.status for r in rows} == {"PUBLISHED"},
    }


def run_database(name: str, url: str, work: Path, sizes: TakeoverSizes) -> dict[str, Any]:
    """The takeovers on one database, with the delivery checks and the load meanwhile."""
    say(f"{name}: {sizes.kills} takeovers at {sizes.rate} ev/s")
    rig = Rig(work, url, sizes.rate)
    rng = random.Random(29)
    monitor = TreeMonitor(os.getpid()).start(1.0)
    takeovers: list[dict[str, float | None]] = []
    try:
        rig.start()
        active, standby = rig.relays
        for _ in range(sizes.kills):
            takeovers.append(takeover(rig, active, standby, sizes.steady_s, rng))
            active, standby = standby, active
        rig.producer.stop.set()
        rig.producer.join()
        done = lambda: set(status_counts(rig.engine)) == {"PUBLISHED"}  # noqa: E731
        wait_for("every row PUBLISHED", done, active.tail)
    finally:
        monitor.stop()
        rig.stop()
    checks = delivery(rig)
    say(f"{name}: {checks}")
    return {
        "takeovers": takeovers,
        "median": {step: _median([t[step] for t in takeovers]) for step in (*STEPS, "warmed_s")},
        **checks,
        "other_processes_cpu_share": round(monitor.foreign_share(), 3),
    }


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 2) if known else None


def main() -> int:
    args = arguments("bench.relay_takeover", __doc__, "one takeover per database").parse_args()
    sizes = SCALE.pick(args.quick)
    machine = machine_info()
    say(f"relay takeover benchmark ({mode(args.quick)}): {sizes}; machine {machine}")
    databases: dict[str, Any] = {}
    result: dict[str, Any] = {
        "machine": machine,
        "code": code_version(),
        "sizes": sizes.as_dict(),
        "databases": databases,
    }
    work = Path(tempfile.mkdtemp(prefix="tidings-takeover-"))
    try:
        (work / "sqlite").mkdir()
        sqlite = f"sqlite:///{work / 'sqlite' / 'app.db'}"
        databases["sqlite"] = run_database("sqlite", sqlite, work / "sqlite", sizes)
        with scratch_database("tidings_takeover_bench") as url:
            (work / "postgresql").mkdir()
            databases["postgresql"] = run_database("postgresql", url, work / "postgresql", sizes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_report("relay_takeover", result, markdown(result, args.quick, runtime_s()), args.results)
    checks = ("exactly_once", "per_key_order", "all_published")
    return 0 if all(d[c] for d in databases.values() for c in checks) else 1


def markdown(r: dict[str, Any], quick: bool, runtime: float) -> str:
    sizes = r["sizes"]
    lines = [
        *heading(
            "Standby relay takeover, step by step",
            command("relay_takeover", *(["--quick"] if quick else [])),
            r["machine"],
            runtime,
            code=r["code"],
        ),
        f"Two `tidings relay` processes on one outbox and checkpoint (default lease: ttl 5 s, "
        f"renewed every 1 s, polled every 500 ms), an `event_server` target on a `tidings server` "
        f"process, {sizes['rate']} ev/s over {KEYS} keys committed throughout; the active relay "
        f"SIGKILLed {sizes['kills']} times per database. Seconds from the kill until each step:",
        "",
    ]
    columns = (*STEPS, "warmed_s")
    header = ("run", *STEPS.values(), "(standby warm, s after it stood by)")
    for name, d in r["databases"].items():
        rows = [(str(n + 1), *(_cell(t[c]) for c in columns)) for n, t in enumerate(d["takeovers"])]
        rows.append(("median", *(_cell(d["median"][c]) for c in columns)))
        checks = (
            f"{d['events']:,} events; every event once at the target / per-key order / all "
            f"PUBLISHED: {d['exactly_once']} / {d['per_key_order']} / {d['all_published']}; other "
            f"processes used {d['other_processes_cpu_share']:.0%} of the cores meanwhile."
        )
        lines += section(name, [*table(header, "l" + "r" * len(columns), rows), "", checks])
    lines += section("Steps", [*bullets(f"**{STEPS[k]}**: {_MEANING[k]}" for k in STEPS), ""])
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
