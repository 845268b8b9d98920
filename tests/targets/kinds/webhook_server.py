"""A real HTTP endpoint for the webhook target's tests, run as its own process.

``python -m tests.targets.kinds.webhook_server PORT LOG [CERT KEY]`` serves Starlette on
uvicorn at 127.0.0.1:PORT (HTTPS with CERT and KEY) and appends one JSON line per request to
LOG: the event id, its ``act``, the status answered, the path, the headers and the body.
What it answers is chosen by the event itself, through its ``act`` custom header (a
CloudEvents extension: ``ce-act`` in binary mode, ``act`` in the structured body):

* absent: 200;
* ``refuse``: 422 with a long body;
* ``CODE*N`` (``503*2``, ``429*1``, ``408*3``): CODE for the event's first N requests, then
  200; its ``retryafter`` header, if any, is sent as ``Retry-After``;
* ``always500``: 500 every time; ``slow``: 200 after 3 s; ``moved``: 302;
* ``hold``: 200 after 0.2 s; its record's ``in_flight`` counts the ``hold`` requests
  being answered at once (its own included).

Requests per event are counted in memory, so a restarted server counts afresh. The log is
appended to across restarts, each line written before the answer leaves.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_tries: Counter[str] = Counter()
_in_flight = 0


def _fields(request: Request, body: bytes) -> tuple[str, str, str]:
    """The event id, act and retry-after of a request, in either content mode."""
    if request.headers.get("content-type", "").startswith("application/cloudevents+json"):
        event: dict[str, Any] = json.loads(body)
        return event["id"], event.get("act", ""), event.get("retryafter", "")
    headers = request.headers
    return headers["ce-id"], headers.get("ce-act", ""), headers.get("ce-retryafter", "")


async def hook(request: Request) -> Response:
    global _in_flight
    body = await request.body()
    event_id, act, wait = _fields(request, body)
    _tries[event_id] += 1
    holding = act == "hold"
    _in_flight += holding
    try:
        status, headers, text = await _answer(event_id, act, wait)
        record = {
            "id": event_id,
            "act": act,
            "status": status,
            "path": request.url.path,
            "in_flight": _in_flight,
            "headers": dict(request.headers),
            "body": body.decode(),
        }
        with open(sys.argv[2], "a") as log:
            log.write(json.dumps(record) + "\n")
        return Response(text, status_code=status, headers=headers)
    finally:
        _in_flight -= holding


async def _answer(event_id: str, act: str, wait: str) -> tuple[int, dict[str, str], str]:
    if act == "refuse":
        return 422, {}, "order total is negative; " + "details " * 200
    if act == "always500":
        return 500, {}, "boom"
    if act == "slow":
        await asyncio.sleep(3)
    if act == "hold":
        await asyncio.sleep(0.2)
    if act == "moved":
        return 302, {"Location": "http://elsewhere.invalid/"}, ""
    if "*" in act:
        code, times = act.split("*")
        if _tries[event_id] <= int(times):
            return int(code), ({"Retry-After": wait} if wait else {}), "try later"
    return 200, {}, "ok"


app = Starlette(routes=[Route("/{path:path}", hook, methods=["POST"])])

if __name__ == "__main__":
    tls = {"ssl_certfile": sys.argv[3], "ssl_keyfile": sys.argv[4]} if len(sys.argv) > 4 else {}
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", **tls)
