"""Helpers of the stream tests: an event server with streams in this process, raw FTN3 calls,
and the real FutoIn client (Node) as a subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from bench.harness.processes import free_port, local_address
from tests.support.waiting import until
from tidings.config.passwords import hash_password
from tidings.config.streams import StreamServerConfig, load_stream_server_config
from tidings.server.runner import serve
from tidings.streams.service.runner import streams_attachment

USER, PASSWORD = "ftn18", "ftn18pass"
SEC = f"{USER}:{PASSWORD}"
#: A cheap hash (scrypt N=2^10) for tests; production hashes use the default cost.
PASSWORD_HASH = hash_password(PASSWORD, n=2**10)
OTHER_USER, OTHER_PASSWORD = "other", "otherpass"
OTHER_HASH = hash_password(OTHER_PASSWORD, n=2**10)
#: The stream types of most tests: exact types (addEvent can generate them) and a pattern.
TYPES = {"ORDER": ["orders", "created"], "PAY": ["payments", "done"], "AUDIT": [["audit", "*"]]}
FUTOIN_DIR = Path(__file__).resolve().parents[1] / "interop" / "futoin"


def backend_of(database_url: str) -> dict[str, str]:
    """The server backend section for a database URL of the database_url fixture."""
    if database_url.startswith("sqlite:///"):
        return {"module": "tidings.server.backends.sqlite", "db_path": database_url[10:]}
    return {"module": "tidings.server.backends.postgresql", "url": database_url}


def stream_server_config(database_url: str, **stream: Any) -> dict[str, Any]:
    """A server configuration with one stream ``s`` on a free port at ``/evt`` (with
    ``metrics=True``, the server's metrics endpoint on a free port, where they are served)."""
    entry = {"name": "s", "port": free_port(), "path": "/evt", "types": copy.deepcopy(TYPES)}
    entry |= stream
    config = {
        "type": "event",
        "backend": backend_of(database_url),
        "engine": {"server_id": 1},
        "eventer_server": {"address": local_address(free_port())},
        "stream_users": {
            USER: {"password_hash": PASSWORD_HASH},
            OTHER_USER: {"password_hash": OTHER_HASH},
        },
        "streams": [entry],
    }
    if entry.get("metrics"):
        config["metrics"] = {"port": free_port()}
    return config


BILLING, BILLING_PASSWORD = "billing", "billpass"
BILLING_HASH = hash_password(BILLING_PASSWORD, n=2**10)
BILLING_SEC = f"{BILLING}:{BILLING_PASSWORD}"
#: The restricted user of :func:`access_config`: billing reads ORDER events of tenant acme as
#: BILL* components, and may add them; live, it reads ORDER and AUDIT events of acme or of
#: every tenant ("all").
ALLOW = [
    {
        "streams": ["s"],
        "components": ["BILL*"],
        "types": ["ORDER"],
        "add_event": ["ORDER"],
        "where": {"/tenant": "acme"},
    },
    {
        "streams": ["s"],
        "components": ["LIVE"],
        "types": ["ORDER", "AUDIT"],
        "where": {"/tenant": {"in": ["acme", "all"]}},
    },
]


def access_config(database: str, **stream: Any) -> dict[str, Any]:
    """Stream ``s`` (metrics on) and stream ``t`` on the same port, the stream helpers'
    unrestricted users, and ``billing`` with :data:`ALLOW`."""
    config = stream_server_config(database, secure_channel=True, metrics=True, **stream)
    config["streams"].append(config["streams"][0] | {"name": "t", "path": "/other"})
    config["stream_users"][BILLING] = {
        "password_hash": BILLING_HASH,
        "allow": copy.deepcopy(ALLOW),
    }
    return config


@dataclass
class Serving:
    """A running server with streams: its configuration and the first stream's URL."""

    config: StreamServerConfig
    url: str

    @property
    def ws_url(self) -> str:
        return "ws" + self.url[4:]

    @property
    def metrics_url(self) -> str:
        """The server's metrics endpoint, where the streams' metrics are served."""
        assert self.config.metrics is not None, "stream_server_config(..., metrics=True)"
        return f"http://127.0.0.1:{self.config.metrics.port}/metrics"


@contextlib.asynccontextmanager
async def serving(config: dict[str, Any]) -> AsyncIterator[Serving]:
    """Run ``tidings server`` with ``config`` in this event loop."""
    validated = load_stream_server_config(config)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(validated, stop, streams_attachment(validated)))
    stream = validated.streams[0]
    url = f"http://127.0.0.1:{stream.port}{stream.path}"

    async def accepting() -> bool:
        if task.done():
            task.result()
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", stream.port)
        except OSError:
            return False
        writer.close()
        return True

    for _ in range(500):
        if await accepting():
            break
        await asyncio.sleep(0.02)
    try:
        yield Serving(validated, url)
    finally:
        stop.set()
        await task


@contextlib.contextmanager
def serving_in_thread(config: dict[str, Any]) -> Iterator[Serving]:
    """:func:`serving` on an event loop of its own thread, for tests whose own code blocks
    (Spark)."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        state["stop"] = asyncio.Event()
        state["loop"] = asyncio.get_running_loop()
        try:
            async with serving(config) as server:
                state["server"] = server
                ready.set()
                await state["stop"].wait()
        except BaseException as exc:
            state["error"] = exc
            ready.set()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(30), "the stream server did not start"
    if "error" in state:
        raise state["error"]
    try:
        yield state["server"]
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(30)


async def call(
    url: str, function: str, params: dict[str, Any] | None = None, sec: str | None = SEC
) -> dict[str, Any]:
    """One raw FTN3 call over HTTP; the decoded reply."""
    message: dict[str, Any] = {"f": function, "p": params or {}}
    if sec is not None:
        message["sec"] = sec
    async with httpx.AsyncClient() as client:
        response = await client.post(
            url, content=json.dumps(message), headers={"Content-Type": "application/futoin+json"}
        )
    assert response.headers["content-type"] == "application/futoin+json"
    return response.json()


async def add_events(url: str, count: int, event_type: str = "ORDER") -> list[int]:
    """Generate ``count`` events over HTTP; their ids."""
    ids = []
    for index in range(count):
        reply = await call(
            url, "futoin.evt.gen:1.1:addEvent", {"type": event_type, "data": {"i": index}}
        )
        ids.append(int(reply["r"]))
    return ids


async def poll(url: str, component: str, last_id: int | None = None, **params: Any) -> Any:
    """pollEvents over HTTP; the reply."""
    p = {"component": component, "last_id": None if last_id is None else str(last_id)} | params
    return await call(url, "futoin.evt.poll:1.1:pollEvents", p)


class RawConsumer:
    """A consumer speaking FTN3 over a WebSocket by hand, to see every frame."""

    def __init__(self, ws: Any, sec: str = SEC) -> None:
        self.ws = ws
        self.sec = sec
        self.calls = 0

    @classmethod
    async def connect(cls, url: str, sec: str = SEC) -> RawConsumer:
        return cls(await websockets.connect(url, max_size=None), sec)

    async def request(
        self, func: str, params: dict[str, Any], iface: str = "futoin.evt.push"
    ) -> str:
        self.calls += 1
        rid = f"C{self.calls}"
        message = {"f": f"{iface}:1.1:{func}", "p": params, "rid": rid, "sec": self.sec}
        await self.ws.send(json.dumps(message).encode())  # binary, as FutoIn sends
        return rid

    async def start(self, component: str, want: list[str] | None = None) -> None:
        if component != "LIVE":
            await self.request("registerConsumer", {"component": component})
        await self.request("readyToReceive", {"component": component, "want": want})

    async def next_push(self, timeout: float = 5.0) -> dict[str, Any]:
        """The next onEvents call (replies to our requests are skipped)."""
        while True:
            message = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
            if "f" in message:
                assert message["f"] == "futoin.evt.receiver:1.1:onEvents"
                assert message["rid"].startswith("S")
                return message
            assert "e" not in message, message

    async def no_push(self, wait: float = 0.5) -> None:
        with pytest.raises(TimeoutError):
            await self.next_push(wait)

    async def ack(self, push: dict[str, Any], reply: Any = True) -> None:
        await self.ws.send(json.dumps({"r": reply, "rid": push["rid"]}))

    async def collect(self, count: int) -> tuple[list[int], list[int]]:
        """Acknowledge pushes until ``count`` events came; their ids and the groups' seqs."""
        ids: list[int] = []
        seqs: list[int] = []
        while len(ids) < count:
            push = await self.next_push()
            ids += push_ids(push)
            seqs.append(push["p"]["seq"])
            await self.ack(push)
        return ids, seqs

    async def close(self) -> None:
        await self.ws.close()


def push_ids(push: dict[str, Any]) -> list[int]:
    """The event ids of an onEvents call."""
    return [int(event["id"]) for event in push["p"]["events"]]


def node() -> str:
    """The Node binary with the pinned FutoIn client installed, or a clear failure."""
    binary = shutil.which("node")
    if binary is None or not (FUTOIN_DIR / "node_modules" / "futoin-eventstream").is_dir():
        pytest.fail(
            "the FutoIn client is not installed: run `bash scripts/setup.sh --dev` "
            f"(npm ci in {FUTOIN_DIR})"
        )
    return binary


class FutoInClient:
    """The real FutoIn client in a Node process (tests/interop/futoin/client.js)."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.lines: list[dict[str, Any]] = []
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> FutoInClient:
        self._process = await asyncio.create_subprocess_exec(
            node(),
            str(FUTOIN_DIR / "client.js"),
            json.dumps(self.options),
            stdout=asyncio.subprocess.PIPE,
            cwd=FUTOIN_DIR,
        )
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        async for line in self._process.stdout:
            self.lines.append(json.loads(line))

    @property
    def events(self) -> list[dict[str, Any]]:
        return [line["event"] for line in self.lines if "event" in line]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [line for line in self.lines if "error" in line]

    async def wait_events(self, count: int, timeout: float = 20.0) -> list[dict[str, Any]]:
        await until(lambda: len(self.events) >= count, timeout)
        return self.events

    async def wait_ready(self, timeout: float = 20.0) -> None:
        await until(lambda: any("ready" in line for line in self.lines), timeout)

    async def finish(self, timeout: float = 30.0) -> int:
        """Wait for the process to exit; its return code."""
        assert self._process is not None and self._reader is not None
        code = await asyncio.wait_for(self._process.wait(), timeout)
        await self._reader
        return code

    async def kill(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()
        if self._reader is not None:
            await self._reader


async def futoin(timeout: float = 30.0, **options: Any) -> FutoInClient:
    """Run the FutoIn client to its end (gen, call, or a count of events)."""
    client = await FutoInClient(**options).start()
    try:
        await client.finish(timeout)
    finally:
        await client.kill()
    return client
