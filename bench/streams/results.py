"""``streams.json`` and ``streams.md``: the goals, both parts' tables, the CPU per phase, the
notes on method and load, and the details."""

from __future__ import annotations

from typing import Any

from bench.harness.cpu import loaded_note
from bench.harness.figures import goals_met
from bench.harness.markdown import bullets, command, heading, section, table
from bench.harness.report import Report
from bench.streams.workload import LOW_RATE, POLL_IDLE_MS, PY_GEN_CONNS, RATE, StreamsSizes

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


def figure_row(
    label: str,
    theirs: float | None,
    ours: float | None,
    unit: str,
    goal_key: str | None,
    met: dict[str, bool],
) -> tuple[str, ...]:
    ratio = f"{ours / theirs:.2f} x" if ours is not None and theirs else "-"
    goal, ok = "", ""
    if goal_key is not None:
        spec = GOALS[goal_key]
        goal = f"<= {spec['max']:g} ms" if "max" in spec else f">= {spec['min_ratio']:g} x"
        ok = "yes" if met[goal_key] else "**no**"
    return (label, shown(theirs, unit), shown(ours, unit), ratio, goal, ok)


def pair(
    label: str, f: dict[str, float | None], key: str, unit: str, met: dict[str, bool]
) -> tuple[str, ...]:
    """One row of (a): ``key`` names the tidings figure; FutoIn's is the same with futoin."""
    theirs = f.get(key.replace("tidings", "futoin"))
    return figure_row(label, theirs, f.get(key), unit, key if key in GOALS else None, met)


def table_a(f: dict[str, float | None], met: dict[str, bool]) -> list[str]:
    rows = []
    labels = {
        "reliable_push": "reliable push (ReliableReceiver)",
        "reliable_poll": "reliable poll (PollFace loop, WebSocket)",
        "live": "live (LIVE polls, WebSocket)",
    }
    for mode, label in labels.items():
        rows.append(pair(label, f, f"{mode}_ev_s_tidings", "ev/s", met))
    for mode, label in labels.items():
        after = f"{mode}_ev_s_tidings_after_first_event"
        rows.append(pair(f"{label}, first to last event", f, after, "ev/s", met))
    rows.append(
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
        rows.append(pair(label, f, f"latency_{q}_ms_tidings", "ms", met))
    for consumer in ("push", "poll"):
        for q in ("p50", "p99"):
            key = f"latency_{consumer}_{q}_ms_tidings"
            rows.append(pair(f"latency {q}, {consumer}, at {RATE} ev/s", f, key, "ms", met))
    for consumer in ("push", "poll"):
        key = f"latency_{consumer}_delivery_p99_ms_tidings"
        label = f"latency p99 less addEvent's round trip, {consumer}, at {RATE} ev/s"
        rows.append(pair(label, f, key, "ms", met))
    for consumer in ("push", "poll"):
        key = f"latency_{consumer}_p99_ms_tidings_at_{LOW_RATE}"
        rows.append(pair(f"latency p99, {consumer}, at {LOW_RATE} ev/s", f, key, "ms", met))
    for consumer in ("push", "poll"):
        for q in ("p50", "p99"):
            key = f"latency_{consumer}_{q}_ms_tidings_sqlite"
            label = f"latency {q}, {consumer}, at {RATE} ev/s, tidings on SQLite (its default)"
            rows.append(pair(label, f, key, "ms", met))
    return table(("measure", "FutoIn", "tidings", "ratio", "goal", "met"), "lrrrlc", rows)


def table_b(f: dict[str, float | None], met: dict[str, bool]) -> list[str]:
    header = ("measure", "JetStream (nats-py pull)", "tidings (Python consume)", "ratio")
    return table(
        (*header, "goal", "met"),
        "lrrrlc",
        [
            figure_row(
                "drain",
                f.get("jetstream_pull_ev_s"),
                f.get("python_consume_ev_s"),
                "ev/s",
                "python_consume_ev_s",
                met,
            ),
            figure_row(
                f"latency p50 at {RATE} ev/s",
                f.get("jetstream_pull_latency_p50_ms"),
                f.get("python_consume_latency_p50_ms"),
                "ms",
                None,
                met,
            ),
            figure_row(
                f"latency p99 at {RATE} ev/s",
                f.get("jetstream_pull_latency_p99_ms"),
                f.get("python_consume_latency_p99_ms"),
                "ms",
                "python_consume_latency_p99_ms",
                met,
            ),
            figure_row(
                "latency p99 less the producer call's round trip",
                f.get("jetstream_pull_latency_delivery_p99_ms"),
                f.get("python_consume_latency_delivery_p99_ms"),
                "ms",
                None,
                met,
            ),
        ],
    )


def cpu_table(rows: list[dict[str, Any]]) -> list[str]:
    header = (
        "phase",
        "window s",
        "server (cores)",
        "PostgreSQL (cores)",
        "client (cores)",
        "other processes (share of all cores)",
        "what bounds it",
    )
    cells = [
        (
            r["phase"],
            f"{r['window_s']:.2f}",
            f"{r['server_cores']:.2f}",
            f"{r['postgres_cores']:.2f}",
            f"{r['client_cores']:.2f}",
            f"{r['other_share']:.0%}",
            r["bound"],
        )
        for r in rows
    ]
    return table(header, "lrrrrrl", cells)


def write_markdown(result: dict[str, Any], report: Report, quick: bool) -> str:
    machine = result["machine"]
    f, met = report.figures, result["met"]
    run = command("streams", *(["--quick"] if quick else []))
    lines = [
        *heading("tidings streams benchmark (FTN18)", run, machine, result["runtime_min"] * 60),
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
        *section("Notes", bullets(report.notes)),
        "## Details",
        "",
    ]
    for title, items in report.details.items():
        lines += section(title, bullets(items), level=3)
    return "\n".join(lines)


def method_notes(sizes: StreamsSizes) -> list[str]:
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
    note = loaded_note({r["phase"]: r["other_share"] for r in report.cpu})
    if note is not None:
        report.note(note)
