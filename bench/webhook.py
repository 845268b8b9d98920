"""Benchmark of the webhook target against a plain httpx client posting the same events.

Run ``.venv/bin/python -m bench.webhook [--quick]`` from the checkout. Both sides POST the
same CloudEvents (binary mode, the default envelope's data as the body, the event id as the
idempotency key) to one local endpoint (Starlette on uvicorn, in its own process, answering
200), at the same confirmation level: an event counts once its 2xx came, a key's events one
after another, at most ``concurrency`` requests in flight. The target is driven as the relay
drives it (calls of ``batch`` events in log order; the target chains a key's events in a call);
the reference is one asyncio loop with an ``httpx.AsyncClient`` and a semaphore. The figure
is events per second, and the target's as a share of the reference's (goal >= 0.8).
It writes ``bench/results/webhook.json`` and ``bench/results/webhook.md``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bench.harness.machine import code_version, machine_info
from bench.harness.markdown import command, heading, table
from bench.harness.processes import free_port, wait_for_port
from bench.harness.progress import runtime_s, say
from bench.harness.report import write_report
from bench.harness.sizes import Scale, Sizes, arguments, mode
from tidings.events.outbox import OutboxEvent
from tidings.outbox.envelope import EventDraft, cloudevents_envelope


@dataclass(frozen=True)
class WebhookSizes(Sizes):
    events: int
    keys: int
    batch: int
    concurrency: int


SCALE = Scale(
    full=WebhookSizes(events=20_000, keys=1_000, batch=500, concurrency=16),
    quick=WebhookSizes(events=400, keys=40, batch=100, concurrency=8),
)
GOAL = 0.8


def serve(port: int) -> None:
    """The endpoint: 200 to every POST (run as ``python -m bench.webhook --serve PORT``)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def hook(request: Request) -> Response:
        await request.body()
        return Response("ok")

    app = Starlette(routes=[Route("/hook", hook, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def workload(sizes: WebhookSizes) -> list[OutboxEvent]:
    logged_at = datetime.now(UTC)
    events = []
    for seq in range(sizes.events):
        key, event_id = f"order-{seq % sizes.keys}", str(uuid.uuid4())
        draft = EventDraft(
            event_id,
            "order.created",
            {"n": seq, "total": 12.5},
            logged_at,
            "1",
            "orders",
            None,
            key,
        )
        payload = json.dumps(cloudevents_envelope(draft))
        events.append(
            OutboxEvent(
                seq, event_id, "order.created", payload, logged_at, "1", None, "orders", key
            )
        )
    return events


def tidings_rate(url: str, events: list[OutboxEvent], sizes: WebhookSizes) -> float:
    import tidings.targets.registry  # noqa: F401 - the target kinds
    from tidings.config import load_config
    from tidings.targets.kinds.webhook.target import WebhookTarget

    entry = {"kind": "webhook", "url": url, "max_concurrency": sizes.concurrency}
    config = load_config({"targets": {"hook": entry}}).targets["hook"]
    target = WebhookTarget("hook", config)
    try:
        target.publish(events[:1])  # connect
        started = time.perf_counter()
        for start in range(0, len(events), sizes.batch):
            results = target.publish(events[start : start + sizes.batch])
            assert not any(results), results
        return len(events) / (time.perf_counter() - started)
    finally:
        target.close()


async def _reference(url: str, events: list[OutboxEvent], sizes: WebhookSizes) -> float:
    import httpx

    limit = asyncio.Semaphore(sizes.concurrency)
    async with httpx.AsyncClient() as client:

        async def post(event: OutboxEvent) -> None:
            envelope = json.loads(event.payload)
            headers = {
                "Content-Type": "application/json",
                "ce-specversion": "1.0",
                "ce-id": event.event_id,
                "ce-source": envelope["source"],
                "ce-type": envelope["type"],
                "ce-time": envelope["time"],
                "ce-subject": envelope["subject"],
                "Idempotency-Key": event.event_id,
            }
            async with limit:
                response = await client.post(
                    url, content=json.dumps(envelope["data"]), headers=headers
                )
            response.raise_for_status()

        await post(events[0])  # connect
        started = time.perf_counter()
        for start in range(0, len(events), sizes.batch):
            await asyncio.gather(*(post(e) for e in events[start : start + sizes.batch]))
        return len(events) / (time.perf_counter() - started)


def markdown(result: dict[str, Any], quick: bool) -> str:
    rows = [
        ("tidings webhook target", f"{result['tidings_events_s']:,.0f}", ""),
        ("plain httpx client", f"{result['httpx_events_s']:,.0f}", ""),
        ("target ÷ reference", f"{result['ratio']:.2f}", f"≥ {GOAL}"),
    ]
    s = result["sizes"]
    lines = [
        *heading(
            "Webhook target benchmark" + (" (--quick)" if quick else ""),
            command("webhook", *(["--quick"] if quick else [])),
            result["machine"],
            result["runtime_s"],
            code=result["code"],
        ),
        f"{s['events']:,} events over {s['keys']:,} keys, calls of {s['batch']}, at most "
        f"{s['concurrency']} requests in flight, to one local endpoint answering 200.",
        "",
        *table(("events/s", "value", "goal"), "lrl", rows),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]))
        return
    options = arguments("bench.webhook", __doc__, "400 events, to check that it runs").parse_args()
    sizes = SCALE.pick(options.quick)
    say(f"webhook benchmark ({mode(options.quick)}): {sizes}")
    port = free_port()
    endpoint = subprocess.Popen([sys.executable, "-m", "bench.webhook", "--serve", str(port)])
    try:
        wait_for_port(port, 30, process=endpoint)
        url = f"http://127.0.0.1:{port}/hook"
        events = workload(sizes)
        ours = tidings_rate(url, events, sizes)
        say(f"tidings: {ours:,.0f} events/s")
        theirs = asyncio.run(_reference(url, workload(sizes), sizes))
        say(f"httpx: {theirs:,.0f} events/s")
    finally:
        endpoint.terminate()
        endpoint.wait()
    result = {
        "machine": machine_info(spark=False),
        "code": code_version(),
        "runtime_s": runtime_s(),
        "sizes": sizes.as_dict(),
        "tidings_events_s": round(ours, 1),
        "httpx_events_s": round(theirs, 1),
        "ratio": round(ours / theirs, 3),
    }
    paths = write_report("webhook", result, markdown(result, options.quick), options.results)
    say(f"wrote {paths[0]} and {paths[1]}")


if __name__ == "__main__":
    main()
