"""Benchmark of tidings' FTN18 streams, side by side with FutoIn's own server and JetStream.

``python -m bench.streams [--quick]``: part (a), then part (b), each on scratch databases and
servers of its own that are removed at its end, then the report; the package's docstring
says what each part measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench.harness.databases import postgresql_version, scratch_database
from bench.harness.machine import code_version, first_line, machine_info
from bench.harness.processes import NATS_SERVER, NatsServer, free_port
from bench.harness.progress import runtime_s, say
from bench.harness.report import Report, attempt, write_report
from bench.harness.sizes import arguments, mode
from bench.streams.consumer_latency import part_b_async
from bench.streams.latency import (
    latency_note,
    phase_latency,
    phase_latency_low,
    phase_latency_sqlite,
)
from bench.streams.profile import profile_bound_rates
from bench.streams.rates import phase_rates
from bench.streams.results import build_result, load_notes, method_notes, write_markdown
from bench.streams.servers import FutoInServer, running, tidings_server
from bench.streams.workload import LOW_RATE, SCALE, StreamsSizes, fill_futoin, fill_tidings


def part_a(work: Path, sizes: StreamsSizes, report: Report, stack: contextlib.ExitStack) -> None:
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
    medians = attempt("(a) rates", lambda: phase_rates(servers, markers, sizes, report), report)
    if medians:
        attempt(
            "(a) profile of client-bound rates",
            lambda: profile_bound_rates(servers, medians, markers, sizes, work, report),
            report,
        )
    attempt("(a) latency", lambda: phase_latency(servers, sizes, report), report)
    latency_note(report)
    attempt(
        f"(a) latency at {LOW_RATE} ev/s", lambda: phase_latency_low(servers, sizes, report), report
    )
    attempt(
        "(a) latency, tidings on SQLite", lambda: phase_latency_sqlite(work, sizes, report), report
    )
    report.note(
        "FutoIn's server exits when a consumer leaves with an onEvents call unanswered "
        "(uncaught CommError in futoin-executor's WSChannelContext._cleanup), so the drains "
        "let the client acknowledge the last group before it leaves (linger_ms) and the "
        "benchmark starts the server again when it died: "
        + ("it ran throughout" if futoin.starts == 1 else f"it was started {futoin.starts} times")
    )


def part_b(work: Path, sizes: StreamsSizes, report: Report, stack: contextlib.ExitStack) -> None:
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
    attempt(
        "(b) Python consumer vs JetStream",
        lambda: asyncio.run(
            part_b_async(stream_url, tidings_pid, nats_server.url, nats_pid, sizes, report)
        ),
        report,
    )


def versions() -> dict[str, str]:
    """The versions of the servers and runtimes besides Python the report names."""
    return {
        "node": first_line("node", "--version"),
        "postgresql": postgresql_version(),
        "nats_server": first_line(NATS_SERVER, "--version"),
    }


def main() -> int:
    args = arguments("bench.streams", __doc__, "smaller sizes, under 3 minutes").parse_args()
    sizes = SCALE.pick(args.quick)
    work = Path(tempfile.mkdtemp(prefix="tidings-bench-streams-"))
    report = Report()
    say(f"tidings streams benchmark ({mode(args.quick)}), work dir {work}")
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
    paths = write_report(
        "streams", result, write_markdown(result, report, args.quick), args.results
    )
    say(f"done in {runtime_s() / 60:.1f} min; met: {result['met']}")
    say(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
