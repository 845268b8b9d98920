"""How long a relay takes from its launch to the first event delivered, step by step.

Run ``.venv/bin/python -m bench.cold_start [--quick]`` from the checkout. Each run is a
cold start in a fresh folder: a SQLite outbox with ``events`` events already committed (over
a few keys), an ``event_store`` target on a SQLite file (the embedded setup), a new
checkpoint; then ``tidings --log-level INFO relay -c FILE`` is launched as a user runs it (a
subprocess: a new interpreter, a new JVM) and the benchmark waits until the first batch is
recorded, then stops the relay (SIGTERM).

``cold_start_s`` is the time from the launch to the first event PUBLISHED (the outbox row's
``last_publish_at``, stamped by the relay's worker when every target confirmed it). Each step
of the start is read from the relay's own log lines (JSON, millisecond stamps: what an
operator sees too), as seconds from the launch:

* ``command``: ``relay command started`` (the interpreter and the command line's imports);
* ``imports``: ``relay imports loaded`` (the relay's modules: PySpark, SQLAlchemy, ...);
* ``config``: ``relay configuration loaded`` (the file read, the database's schema checked);
* ``spark``: ``relay spark session up`` (the JVM launched, the SparkSession made);
* ``lease``: ``relay lease taken``;
* ``query``: ``relay started`` (the streaming query built and started);
* ``planned``: ``relay first batch planned`` (Spark's streaming source, a Python process of
  its own, planned the first micro-batch, which is in the checkpoint's offsets);
* ``worker``: ``relay task worker ready`` (the first task's Python worker started and
  loaded tidings);
* ``stored``: the store's first event (its timestamp);
* ``published``: the first outbox row's ``last_publish_at``;
* ``recorded``: ``relay first batch recorded``.

``--relay-option KEY=VALUE`` (repeatable; VALUE is YAML) sets a key of the configuration's
``relay`` section in every run, e.g. ``driver_java_options=-XX:TieredStopAtLevel=1``, to
compare a setting against the default in back-to-back runs: the machine's load changes
every step, so only runs side by side compare. Writes ``bench/results/cold_start.json`` and
``.md`` (``--results`` elsewhere), with the machine and the CPU other processes used.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.harness.machine import code_version, machine_info
from bench.harness.markdown import bullets, command, heading, section, table
from bench.harness.outbox import status_counts
from bench.harness.processes import kill_tree
from bench.harness.progress import runtime_s, say
from bench.harness.report import write_report
from bench.harness.sizes import Scale, Sizes, arguments, mode
from bench.harness.trees import TreeMonitor
from bench.relay_takeover import RelayProcess
from tidings.db import make_engine
from tidings.events.timeutil import as_utc
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import ensure_schema, outbox_event
from tidings.server.store import EventStore

KEYS = 4
EVENT_TYPE = "Moved"
#: The steps of a start the relay logs, in the order they happen: step -> its log line.
LOGGED = {
    "command": "relay command started",
    "imports": "relay imports loaded",
    "config": "relay configuration loaded",
    "spark": "relay spark session up",
    "lease": "relay lease taken",
    "query": "relay started",
    "planned": "relay first batch planned",
    "worker": "relay task worker ready",
}
#: Every step reported, in order (the logged ones, then what the target and outbox say).
STEPS = (*LOGGED, "stored", "published", "recorded")
_DONE = "relay first batch recorded"
_WAIT_S = 300.0


@dataclass(frozen=True)
class ColdStartSizes(Sizes):
    """Cold starts measured, and the events committed before each."""

    runs: int
    events: int


SCALE = Scale(full=ColdStartSizes(5, 1000), quick=ColdStartSizes(1, 100))


def prepare(folder: Path, events: int, relay_options: dict[str, Any]) -> Path:
    """A fresh outbox with ``events`` committed, and the configuration file of its relay."""
    folder.mkdir(parents=True)
    engine = make_engine(f"sqlite:///{folder / 'app.db'}")
    try:
        ensure_schema(engine)
        with Outbox(engine).transaction() as tx:
            for i in range(events):
                tx.emit(EVENT_TYPE, {"i": i}, partition_key=f"k{i % KEYS}")
    finally:
        engine.dispose()
    config = {
        "database": {"url": "sqlite:///app.db"},
        "targets": {"store": {"kind": "event_store", "url": "sqlite:///events.db"}},
        "routing": {"routes": {EVENT_TYPE: ["store"]}},
        "relay": {"checkpoint_dir": "checkpoint", **relay_options},
    }
    path = folder / "tidings.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def cold_start(folder: Path, events: int, relay_options: dict[str, Any]) -> dict[str, float | None]:
    """One cold start: seconds from the launch to each step (see the module's docstring)."""
    relay = RelayProcess("relay", prepare(folder, events, relay_options))
    engine = make_engine(f"sqlite:///{folder / 'app.db'}")
    launched = time.time()
    relay.start()
    try:
        deadline = time.monotonic() + _WAIT_S
        while relay.logged(_DONE) is None:
            if relay.proc is not None and relay.proc.poll() is not None:
                raise RuntimeError(f"the relay exited early:\n{relay.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no batch recorded after {_WAIT_S:g} s:\n{relay.tail()}")
            time.sleep(0.1)
        stamps = {step: _logged_at(relay, message) for step, message in LOGGED.items()}
        stamps["stored"] = first_stored(folder / "events.db")
        stamps["published"] = first_published(engine)
        stamps["recorded"] = _logged_at(relay, _DONE)
        if status_counts(engine).get("PUBLISHED", 0) < 1:
            raise RuntimeError("a batch was recorded but no event is PUBLISHED")
    finally:
        stop(relay)
        engine.dispose()
    return {step: None if t is None else round(t - launched, 3) for step, t in stamps.items()}


def _logged_at(relay: RelayProcess, message: str) -> float | None:
    found = relay.logged(message)
    return None if found is None else found[0]


def first_published(engine: Any) -> float | None:
    """The earliest ``last_publish_at`` of a PUBLISHED row (epoch s)."""
    query = outbox_event.select().where(outbox_event.c.status == "PUBLISHED")
    with engine.connect() as conn:
        stamps = [as_utc(row.last_publish_at).timestamp() for row in conn.execute(query)]
    return min(stamps, default=None)


def first_stored(path: Path) -> float | None:
    """The store's first event's timestamp (epoch s)."""
    store = EventStore(f"sqlite:///{path}")
    try:
        first = store.read(0, 1)
    finally:
        store.close()
    return first[0].timestamp_us / 1e6 if first else None


def stop(relay: RelayProcess) -> None:
    """SIGTERM (the relay stops between two batches), its whole group killed after 60 s."""
    proc = relay.proc
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        kill_tree(proc)


def relay_options(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs (VALUE as YAML) as the ``relay`` section's keys."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--relay-option {pair!r}: give KEY=VALUE")
        options[key] = yaml.safe_load(value) if value else ""
    return options


def main() -> int:
    parser = arguments("bench.cold_start", __doc__, "one cold start of 100 events")
    parser.add_argument(
        "--relay-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a key of the relay section for every run (VALUE is YAML)",
    )
    args = parser.parse_args()
    sizes = SCALE.pick(args.quick)
    options = relay_options(args.relay_option)
    machine = machine_info()
    say(f"cold start benchmark ({mode(args.quick)}): {sizes}, relay {options}; {machine}")
    runs: list[dict[str, float | None]] = []
    work = Path(tempfile.mkdtemp(prefix="tidings-cold-start-"))
    monitor = TreeMonitor(os.getpid()).start(1.0)
    try:
        for n in range(sizes.runs):
            steps = cold_start(work / f"run-{n + 1}", sizes.events, options)
            say(f"run {n + 1}: " + ", ".join(f"{k} {v}" for k, v in steps.items()))
            runs.append(steps)
    finally:
        monitor.stop()
        shutil.rmtree(work, ignore_errors=True)
    median = {step: _median([run[step] for run in runs]) for step in STEPS}
    result: dict[str, Any] = {
        "machine": machine,
        "code": code_version(),
        "sizes": sizes.as_dict(),
        "relay_options": options,
        "figures": {"cold_start_s": median["published"]},
        "runs": runs,
        "median": median,
        "other_processes_cpu_share": round(monitor.foreign_share(), 3),
    }
    say(f"cold_start_s (median): {median['published']}")
    write_report("cold_start", result, markdown(result, args.quick, runtime_s()), args.results)
    return 0


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 2) if known else None


#: What each step is, for the report.
_MEANING = {
    "command": "`relay command started`: the interpreter and the command line's imports",
    "imports": "`relay imports loaded`: the relay's modules (PySpark, SQLAlchemy, ...)",
    "config": "`relay configuration loaded`: the file read, the database's schema checked",
    "spark": "`relay spark session up`: the JVM launched and the SparkSession made",
    "lease": "`relay lease taken`",
    "query": "`relay started`: the streaming query built and started",
    "planned": "`relay first batch planned`: Spark's streaming source (a Python process) "
    "planned the first micro-batch",
    "worker": "`relay task worker ready`: the first task's Python worker started and loaded "
    "tidings",
    "stored": "the store's first event (its timestamp)",
    "published": "the first outbox row PUBLISHED (its `last_publish_at`): `cold_start_s`",
    "recorded": "`relay first batch recorded`",
}


def markdown(r: dict[str, Any], quick: bool, runtime: float) -> str:
    sizes = r["sizes"]
    options = r["relay_options"]
    lines = [
        *heading(
            "Relay cold start, step by step",
            command("cold_start", *(["--quick"] if quick else [])),
            r["machine"],
            runtime,
            code=r["code"],
        ),
        f"`tidings relay` launched {sizes['runs']} times, each in a fresh folder: a SQLite "
        f"outbox with {sizes['events']:,} events committed over {KEYS} keys, an `event_store` "
        f"target on a SQLite file, a new checkpoint"
        + (f"; relay settings {json.dumps(options)}" if options else "")
        + f". Other processes used {r['other_processes_cpu_share']:.0%} of the cores "
        "meanwhile. Seconds from the launch until each step:",
        "",
    ]
    rows = [(str(n + 1), *(_cell(run[s]) for s in STEPS)) for n, run in enumerate(r["runs"])]
    rows.append(("median", *(_cell(r["median"][s]) for s in STEPS)))
    lines += [*table(("run", *STEPS), "l" + "r" * len(STEPS), rows), ""]
    lines += section("Steps", [*bullets(f"**{s}**: {_MEANING[s]}" for s in STEPS), ""])
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
