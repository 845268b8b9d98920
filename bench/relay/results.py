"""``relay.json`` and ``relay.md``: each figure with its unit and goal, the notes, the details
of each phase and the method."""

from __future__ import annotations

from typing import Any

from bench.harness.figures import goals_met
from bench.harness.markdown import bullets, command, heading, section, table
from bench.harness.report import Report
from bench.relay.workload import GOALS, UNITS, RelaySizes


def goal_text(name: str, figures: dict[str, float | None]) -> str:
    goal = GOALS[name]
    if "max" in goal:
        return f"<= {goal['max']:,g}"
    if "min" in goal:
        return f">= {goal['min']:,g}"
    raw = figures.get(goal["of"])
    ratio = goal["min_ratio"]
    return f">= {ratio:g} x raw" + (f" = {ratio * raw:,.0f}" if raw else "")


DETAIL_TITLES = {
    "producer": "Producer (1)",
    "embedded": "Relay to the event store (2)",
    "postgres": "Relay on PostgreSQL (2b)",
    "mariadb": "Relay with the outbox on MariaDB (2d)",
    "scaling": "Relay scaling (2c)",
    "jetstream": "Relay to JetStream (3)",
    "latency": "Latency (4)",
    "pss": "Peak PSS (5)",
    "load": "Machine load by other processes",
}
METHOD = [
    "## Method",
    "",
    "1. Producer: SQLite files in WAL with synchronous=NORMAL; each transaction updates one "
    "account row and adds one event. tidings: `outbox.transaction()` + `tx.emit`; raw: "
    "`sqlite3` on its own file with the same PRAGMAs and tidings' own `outbox_event` table "
    "(created by `ensure_schema`), UPDATE + INSERT (uuid4, json.dumps payload) + commit. "
    "Rounds alternate sides on fresh files after a short warm-up; ratio of medians. "
    "Second baseline (`producer_overhead_vs_core`): the same transaction with the outbox "
    "row written by the application itself through SQLAlchemy Core (`outbox_event.insert()`), "
    "on an engine made with tidings' own settings: the hand-rolled outbox a user would "
    "otherwise write.",
    "2. Embedded: a backlog emitted via Outbox (1000 per transaction, ~10k partition keys) "
    "drained by `start_relay(..., available_now=True)` into an event_store target on "
    "SQLite; Spark started and warmed by a 10-event relay first; max_events_per_batch "
    "100000, partitions 2; the clock covers query start to termination.",
    "2b. PostgreSQL: the same with the outbox and the event store in fresh databases on the "
    "local PostgreSQL server (dropped afterwards).",
    "2d. MariaDB: the same with the outbox in a fresh database on the local MariaDB server "
    "(dropped afterwards) and the event store on SQLite (it does not run on MySQL); the log "
    "is read through the gap-safe watermark of writer slots.",
    "2c. Scaling: phase 2's drain again on a fresh log; then the same backlog behind 24 times "
    "as many rows already PUBLISHED (written in SQL with the batch-log row an earlier relay "
    "leaves, so the relay starts after them); then a backlog ten times phase 2's. Each rate "
    "is divided by the mean of the two fresh-log rates; each drain has a fresh event store.",
    "3. JetStream: the same with a jetstream target (unique stream, deleted afterwards); "
    "raw baseline: nats-py pipelined publishes of same-size messages with Nats-Msg-Id to "
    "a fresh stream, acks awaited per window; measured before and after the relay.",
    "4. Latency: streaming relay (trigger 100 ms) on a fresh database; paced producer, "
    "one event per transaction; latency = last_publish_at - logged_at; the figures are the "
    "load's last window after its warm-up (full run: the last 20 s of 80, the first 60 s "
    "warm the driver JVM), every window listed.",
    "5. PSS: `python -m tidings.cli relay --config cfg.yaml --once` as a subprocess; the "
    "PSS of its whole process tree (driver, JVM, Python workers) summed every 0.2 s.",
    "",
]


def _figure_rows(result: dict[str, Any], figures: dict[str, float | None]) -> list[list[str]]:
    """The table's rows: each figure with its unit, goal and whether it was met."""
    rows = []
    for name, (fmt, unit) in UNITS.items():
        value = figures.get(name)
        shown = "n/a" if value is None else f"{fmt.format(value)} {unit}"
        if name in GOALS:
            ok = "n/a" if value is None else "yes" if result["met"][name] else "**no**"
            rows.append([name, shown, goal_text(name, figures), ok])
        else:
            rows.append([name, shown, "(baseline)", ""])
    return rows


def write_markdown(
    result: dict[str, Any], report: Report, options: list[str], runtime: float
) -> str:
    """relay.md; ``options``: the command line's options, as the run was given them."""
    run = command("relay", *options)
    lines = [
        *heading("tidings relay benchmark", run, result["machine"], runtime),
        *table(("measure", "value", "goal", "met"), "lrlc", _figure_rows(result, report.figures)),
        "",
        *section("Notes", bullets(result["notes"]) or ["- none"]),
        "## Details",
        "",
    ]
    for key, title in DETAIL_TITLES.items():
        if key in report.details:
            lines += section(title, bullets(report.details[key]), level=3)
    return "\n".join(lines + METHOD)


def build_result(
    machine: dict[str, Any], code: str, sizes: RelaySizes, quick: bool, report: Report
) -> dict[str, Any]:
    """relay.json's content: the machine, each figure, the goals and the notes."""
    report.notes.insert(0, f"code measured: {code}")
    if quick:
        report.notes.insert(
            0,
            f"--quick run: smaller sizes ({sizes.producer_txns} producer txns, "
            f"{sizes.embedded_events:,} / {sizes.jetstream_events:,} relay events, "
            f"{sizes.latency_seconds:g} s latency load, {sizes.pss_events:,} PSS backlog)",
        )
    goals, met = GOALS, goals_met(report.figures, GOALS)
    result: dict[str, Any] = {"machine": machine}
    for name in UNITS:  # "relay_scaling.log_5m" goes to relay_scaling: {"log_5m": ...}
        group, _, key = name.rpartition(".")
        into = result.setdefault(group, {}) if group else result
        into[key] = report.figures.get(name)
    result["goals"] = goals
    result["met"] = met
    result["notes"] = report.notes
    return result
