"""Benchmark of tidings' event server against hat-event 0.8.5's own server (lmdb backend).

``python -m bench.server [--quick] [--only KIND] [--keep] [--hostile on|off|only]``: every
server up at once, the steps, then the report; the package's docstring says what each step
measures.
"""

from __future__ import annotations

import asyncio
import platform
import sys
from importlib.metadata import version
from typing import Any

from bench.harness.machine import code_version, machine_info
from bench.harness.progress import runtime_s, say
from bench.harness.report import write_report
from bench.harness.sizes import arguments, mode
from bench.server.hostile import evaluate as evaluate_hostile
from bench.server.results import (
    evaluate,
    evaluate_pg,
    fairness_notes,
    load_notes,
    print_table,
    write_markdown,
)
from bench.server.steps import run_all
from bench.server.workload import (
    EXTRAS,
    HOSTILE_KINDS,
    MEASURES,
    PG_KINDS,
    SCALE,
    SERVERS,
    TIDINGS_KINDS,
)
from tidings.config.server import DEFAULT_MAX_FRAME_BYTES


def main() -> int:
    parser = arguments("bench.server", __doc__, "smaller sizes, about a minute")
    parser.add_argument("--only", choices=SERVERS, help="run one server only")
    parser.add_argument("--keep", action="store_true", help="keep the servers' work directories")
    parser.add_argument(
        "--hostile",
        choices=("on", "off", "only"),
        default="on",
        help="the hostile-clients phase after the others (on), not at all, or alone",
    )
    args = parser.parse_args()
    say(f"server benchmark ({mode(args.quick)})")
    machine = machine_info(spark=False)
    machine["os"] = platform.platform()
    machine["hat_event"] = version("hat-event")
    say(f"machine: {machine}")
    code = code_version()
    say(f"code: {code}")
    sizes = SCALE.pick(args.quick)
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
    result["sizes"] = sizes.as_dict()
    runtime = runtime_s()
    paths = write_report(
        "server", result, write_markdown(result, args.quick, args.only, runtime), args.results
    )
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
