"""The run through the steps: every server up at once, each step on each server in turn, the
order rotating, every server idle before each phase; then the hostile clients."""

from __future__ import annotations

import asyncio
import contextlib
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from hat.event import eventer

from bench.harness.progress import say
from bench.server.hostile import Target, hostile_phase
from bench.server.notify import notify_latency
from bench.server.queries import latest_queries, ordered_queries, query_setup
from bench.server.registers import register_batch, register_ff, register_single
from bench.server.servers import BenchServer, Run, settle
from bench.server.workload import FLOOR_STEPS, HOSTILE_KINDS, ServerSizes, is_floor

STEPS: list[tuple[str, Callable[[eventer.Client, Run, ServerSizes], Awaitable[None]]]] = [
    ("register batch", register_batch),
    ("register single", register_single),
    ("register fire-and-forget", register_ff),
    ("query setup", query_setup),
    ("latest queries", latest_queries),
    ("ordered query", ordered_queries),
    ("notify latency", notify_latency),
]
NEEDS = {"latest queries": "query setup", "ordered query": "query setup"}


@dataclass
class Bench:
    """One server's run through the steps: its figures, its client and the steps that
    failed (a later step that needs one is skipped)."""

    run: Run
    sizes: ServerSizes
    client: eventer.Client | None = None
    failed: set[str] = field(default_factory=set)
    #: Set once the server could not start or exited: it takes no further step.
    down: bool = False

    async def step(
        self, name: str, step: Callable[[eventer.Client, Run, ServerSizes], Awaitable[None]]
    ) -> None:
        """Run one step; a failing step (wrong answer, dropped connection) is recorded in
        ``run.errors`` and the next one gets a new connection."""
        run, server, kind = self.run, self.run.server, self.run.kind
        if self.down or (is_floor(kind) and name not in FLOOR_STEPS):
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
        """The hostile phase (the hostile module's rows) against this server alone."""
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


async def run_all(
    kinds: list[str], sizes: ServerSizes, keep: bool, hostile: str
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
