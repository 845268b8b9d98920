"""``server.json`` and ``server.md``: each measure of tidings against hat's (and on PostgreSQL
against SQLite) with its goal, the notes on fairness and load, the CPU per phase and the
method."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.harness.cpu import cpu_share, loaded_note
from bench.harness.markdown import command, heading, table
from bench.server.hostile import markdown as hostile_markdown
from bench.server.servers import Run
from bench.server.workload import (
    EXTRAS,
    FLOOR_KIND,
    MEASURES,
    PG_KINDS,
    PG_WITHIN,
    STORE_FLOOR_KINDS,
    TIDINGS_KINDS,
    ServerSizes,
)


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
        cells = [f"{name} (ms)", fmt(result.get(f"{name}_hat"), "ms"), *[""] * 2 * len(FLOORS)]
        for kind in (*TIDINGS_KINDS, *PG_KINDS):
            cells += [fmt(result.get(f"{name}_{kind}"), "ms"), ""]
        rows.append((*cells, "", ""))
    return rows


#: The floor servers, in the table's order: storing nothing, then storing as tidings' SQLite
#: store does with each durability.
FLOORS = (FLOOR_KIND, *STORE_FLOOR_KINDS)


def floor_cells(result: dict[str, Any], name: str) -> list[str]:
    """Each floor server's figure of a measure and its ratio to hat's: the most any server
    (storing nothing, or storing as tidings does) could reach against hat with this client
    here (register measures only)."""
    cells = []
    h = result.get(f"{name}_hat")
    for kind in FLOORS:
        f = result.get(f"{name}_{kind}")
        cells += (
            ["", ""]
            if f is None
            else [fmt(f, MEASURES[name][0]), "n/a" if not h else f"{f / h:.2f}"]
        )
    return cells


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
    "floor storing, commit",
    "÷ hat",
    "floor storing, periodic",
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
    options = (["--quick"] if quick else []) + (["--only", only] if only else [])
    align = "l" + "r" * (GOAL_COLUMN - 1) + "lc"
    rows = [(*row[:-1], row[-1].replace("no", "**no**")) for row in table_rows(result)]
    lines = [
        *heading(
            "tidings event server vs hat-event 0.8.5",
            command("server", *options),
            result["machine"],
            runtime,
            code=result["code"],
            more=" Client and server share the machine.",
        ),
        *table(HEADER, align, rows),
    ]
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
        "phase runs on hat and on the commit tidings. floor: `bench/server/floor.py`, which "
        "answers registers as a server would (tidings' frame reading, pre-scan, hat-sbs "
        "decode and encode, numbering) and stores nothing: its register rates, run with the "
        "same client, bound what any Python server can reach against hat here (it runs the "
        "register and notify steps only; its fire-and-forget count check is skipped). floor "
        "storing (commit, periodic): the same server running, per register, the SQL statements "
        "tidings' SQLite store runs with that durability (on the store's schema, pragmas and "
        "checkpoint thread) and nothing else of tidings: the most a tidings server storing so can"
        " reach (the requests read from a socket at once stored in one transaction, as tidings "
        "groups queued requests). Every floor also answers subscriptions and sends each "
        "register's events to its subscribers before the reply (the notify floor).",
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


def fairness_notes(quick: bool, sizes: ServerSizes) -> list[str]:
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
    """The note on the servers whose phases shared the cores with other work on the
    machine (over all of each server's measuring), if any did."""
    shares = {}
    for kind, run in runs.items():
        wall = sum(c["wall_s"] for c in run.cpu.values())
        shares[kind] = cpu_share(sum(c["other_cpu_s"] for c in run.cpu.values()), wall)
    note = loaded_note(shares)
    return [] if note is None else [note]
