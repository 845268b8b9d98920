"""The "hostile" phase of the server benchmark: one hostile or careless connection at a time
against a server, while a bystander (hat-event 0.8.5's client, in a process of its own)
registers and queries in a loop.

For each row of its table it records the bystander's worst round trip during the row
(from the hostile action's start until 0.3 s after it ended) and the server's peak RSS (the
kernel's high-water mark, ``VmHWM``, reset before each row through ``clear_refs``), and
what happened to the hostile connection. Run by the server benchmark; this module also runs
the bystander process (``python -m bench.server.hostile --bystander ADDRESS``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hat.event.common as hc
import psutil
from hat.event import eventer

from bench.harness.cpu import wait_idle
from bench.harness.processes import bench_env
from bench.harness.progress import say

#: Rows (name -> what the one hostile client does).
ROWS = {
    "bad_byte": "one invalid byte (reference, not in the issue: any refused connection)",
    "lying_count": "one ~30-byte Eventer frame whose SBS Array declares 2^31 items",
    "lying_count_x5": "five such frames in a row",
    "minimal_8mib": "one 8 MiB frame of minimal array items (one byte each)",
    "minimal_32mib": "one 32 MiB frame of the same",
    "queries_4x": "four concurrent queries without max_results over every event",
    "query_all": "one query without max_results over every event (100-byte payloads)",
    "big_register": "one register of 100,000 events (a legitimate ~13 MiB frame), the "
    "client subscribed to them",
}
#: Goals: worst bystander round trip during a single hostile connection, ...
GOAL_WORST_MS = 50.0
#: ... peak RSS growth against the largest frame the server accepted (read) ...
GOAL_FRAME_GROWTH = 2.0
#: ... and the RSS growth while answering the big query.
GOAL_QUERY_GROWTH_MIB = 100.0
#: How long to wait for the server to close a hostile connection, or to answer.
HOSTILE_TIMEOUT_S = 180.0
#: Bystander pause between rounds (it registers one event, then queries it back).
BYSTANDER_PAUSE_S = 0.01
EVENT_PREFIX = ("bench", "h")
MIB = 1024 * 1024


# -- raw frames ------------------------------------------------------------------------------


def _integer(value: int) -> bytes:
    """SBS integer: 7 bits a byte, big-endian, the last byte marked by its top bit."""
    out = [0x80 | (value & 0x7F)]
    value >>= 7
    while value:
        out.insert(0, value & 0x7F)
        value >>= 7
    if out[0] & 0x40:
        out.insert(0, 0)
    return bytes(out)


def _string(text: str) -> bytes:
    data = text.encode()
    return _integer(len(data)) + data


def frame(type_name: str, body: bytes) -> bytes:
    """A chatter frame of a HatEventer message (id 1, fire-and-forget), built by hand."""
    envelope = (
        _integer(1)
        + _integer(1)
        + b"\x01\x01\x01"
        + _integer(1)
        + _string("HatEventer")
        + _string(type_name)
        + _integer(len(body))
        + body
    )
    size = len(envelope)
    length = size.to_bytes(max(1, (size.bit_length() + 7) // 8), "big")
    return bytes([len(length)]) + length + envelope


def lying_frame() -> bytes:
    return frame("MsgRegisterReq", _integer(2**31) + b"\x80")


def minimal_frame(size: int) -> bytes:
    """A subscription of ``size`` bytes of empty event types (one byte each)."""
    count = size - 16
    return frame("MsgSubscribe", _integer(count) + b"\x80" * count)


# -- the bystander process -------------------------------------------------------------------


async def bystander_main(address: str) -> None:
    """Register one event and query it back, forever; print each round trip as
    ``<end wall time> <milliseconds> <register|query|error>``; reconnect after a failure."""
    seq = 0
    while True:
        try:
            client = await eventer.connect(address, [])
        except Exception as exc:
            print(f"{time.time():.6f} 0 error connect {exc!r}", flush=True)
            await asyncio.sleep(0.1)
            continue
        try:
            while True:
                event = hc.RegisterEvent(
                    event_type=(*EVENT_PREFIX, "bystander", str(seq % 10)),
                    source_timestamp=None,
                    payload=hc.EventPayload(type=hc.EventPayloadType.JSON, data=seq),
                )
                started = time.perf_counter()
                await client.register_with_response([event])
                done = time.perf_counter()
                print(f"{time.time():.6f} {(done - started) * 1000:.3f} register", flush=True)
                query = hc.QueryData(event_types=[(*EVENT_PREFIX, "bystander", "*")], max_results=1)
                started = time.perf_counter()
                await client.query(query)
                done = time.perf_counter()
                print(f"{time.time():.6f} {(done - started) * 1000:.3f} query", flush=True)
                seq += 1
                await asyncio.sleep(BYSTANDER_PAUSE_S)
        except Exception as exc:
            print(f"{time.time():.6f} 0 error {exc!r}", flush=True)
        finally:
            with contextlib.suppress(Exception):
                await client.async_close()


class Bystander:
    """The bystander process and the round trips it reports."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        #: (start, end, milliseconds, register|query) of each request, wall clock.
        self.trips: list[tuple[float, float, float, str]] = []
        self.errors: list[tuple[float, str]] = []
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, address: str, command: Sequence[str] = ()) -> Bystander:
        """Start the bystander process: this module's (hat's client on ``address``), or
        ``command``, any that prints its round trips in the same form."""
        proc = await asyncio.create_subprocess_exec(
            *(command or (sys.executable, "-m", "bench.server.hostile", "--bystander", address)),
            stdout=asyncio.subprocess.PIPE,
            env=bench_env(),
        )
        bystander = cls(proc)
        deadline = time.monotonic() + 30
        while len(bystander.trips) < 20:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"bystander made {len(bystander.trips)} requests in 30 s; "
                    f"its first errors: {bystander.errors[:3]}"
                )
            await asyncio.sleep(0.05)
        return bystander

    async def _read(self) -> None:
        assert self._proc.stdout is not None
        async for line in self._proc.stdout:
            end, ms, kind, *rest = line.decode().strip().split(" ", 3)
            if kind == "error":
                self.errors.append((float(end), " ".join(rest).strip()))
            else:
                self.trips.append((float(end) - float(ms) / 1000, float(end), float(ms), kind))

    async def caught_up(self, at: float, timeout: float = 5.0) -> None:
        """Wait until a round trip begun after ``at`` was read: this process may read the
        bystander's lines late (e.g. while it writes a 32 MiB frame), and a trip it has not
        read yet would otherwise count as one still waiting."""
        deadline = time.monotonic() + timeout
        while not any(t[0] >= at for t in self.trips) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def worst_ms(self, start: float, end: float, kind: str | None = None) -> float:
        """The longest round trip of a request (of ``kind``, if given) that was in flight
        between the two times, counting one still waiting at ``end`` as lasting until then."""
        worst = max(
            (ms for s, e, ms, k in self.trips if e >= start and s <= end and kind in (None, k)),
            default=0.0,
        )
        last_end = max((e for _, e, _, _ in self.trips), default=start)
        return max(worst, (end - max(last_end, start)) * 1000)

    def round_trips(self, start: float, end: float) -> list[float]:
        """The round trips (ms) of the requests in flight between the two times."""
        return sorted(ms for s, e, ms, _ in self.trips if e >= start and s <= end)

    def errors_between(self, start: float, end: float) -> list[str]:
        return [error for at, error in self.errors if start <= at <= end]

    async def stop(self) -> None:
        self._proc.terminate()
        await self._proc.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


# -- hostile actions -------------------------------------------------------------------------


async def send_and_wait_close(port: int, data: bytes) -> str:
    """Send ``data`` on a raw connection; how the server dealt with it."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(data)
            await writer.drain()
        try:
            async with asyncio.timeout(HOSTILE_TIMEOUT_S):
                with contextlib.suppress(ConnectionError):
                    while await reader.read(65536):
                        pass
        except TimeoutError:
            return f"still open after {HOSTILE_TIMEOUT_S:g} s"
        return f"closed by the server after {time.perf_counter() - started:.2f} s"
    finally:
        writer.close()


async def query_all(address: str, clients: int, expected: int) -> str:
    """``clients`` hat clients query every event at once; how they were answered."""
    connected = [await eventer.connect(address, [(*EVENT_PREFIX, "bystander", "*")])]
    connected += [await eventer.connect(address, []) for _ in range(clients - 1)]
    query = hc.QueryData(event_types=[(*EVENT_PREFIX, "big", "*")])
    started = time.perf_counter()
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(c.query(query) for c in connected), return_exceptions=True),
            HOSTILE_TIMEOUT_S,
        )
    except TimeoutError:
        return f"not answered within {HOSTILE_TIMEOUT_S:g} s"
    finally:
        for client in connected:
            with contextlib.suppress(Exception):
                await client.async_close()
    elapsed = time.perf_counter() - started
    outcomes = []
    for result in results:
        if isinstance(result, BaseException):
            outcomes.append(f"failed: {type(result).__name__}: {result}")
        elif len(result) != expected:
            outcomes.append(f"{len(result):,} of {expected:,} events")
        else:
            outcomes.append("all events")
    summary = ", ".join(sorted(set(outcomes)))
    return f"{clients} x {summary} in {elapsed:.1f} s"


async def big_register(address: str, count: int = 100_000) -> str:
    """One client, subscribed to them, registers ``count`` events in one request; how they
    were stored and notified."""
    prefix = (*EVENT_PREFIX, "reg")
    notified = 0

    async def receive_all() -> None:
        nonlocal notified
        while notified < count:
            notified += len(await client.receive())

    client = await eventer.connect(address, [(*prefix, "*")])
    batch = [
        hc.RegisterEvent(
            event_type=(*prefix, f"t{i % 100}"),
            source_timestamp=None,
            payload=hc.EventPayload(type=hc.EventPayloadType.JSON, data="x" * 98),
        )
        for i in range(count)
    ]
    started = time.perf_counter()
    try:
        async with asyncio.timeout(HOSTILE_TIMEOUT_S):
            receiving = asyncio.create_task(receive_all())
            results = await client.register_with_response(batch)
            await receiving
    except TimeoutError:
        return f"{notified:,} of {count:,} notified after {HOSTILE_TIMEOUT_S:g} s"
    finally:
        await client.async_close()
    stored = sum(r is not None for r in results)
    return f"{stored:,} stored, {notified:,} notified in {time.perf_counter() - started:.1f} s"


async def setup_events(address: str, count: int) -> None:
    """``count`` events with 100-byte JSON payloads, in batches of 1,000."""
    client = await eventer.connect(address, [])
    try:
        for start in range(0, count, 1000):
            batch = [
                hc.RegisterEvent(
                    event_type=(*EVENT_PREFIX, "big", f"t{i % 100}"),
                    source_timestamp=None,
                    payload=hc.EventPayload(type=hc.EventPayloadType.JSON, data="x" * 98),
                )
                for i in range(start, min(count, start + 1000))
            ]
            results = await client.register_with_response(batch)
            if any(r is None for r in results):
                raise RuntimeError("setup: the server refused events")
    finally:
        await client.async_close()


# -- the phase -------------------------------------------------------------------------------


@dataclass
class Target:
    """What the phase needs of a server under test."""

    kind: str
    address: str
    port: int
    pid: int


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid``, in bytes."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    return values


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def actions(target: Target, events: int) -> dict[str, Callable[[], Awaitable[str]]]:
    """Each row's action; frames are built here, before any row is timed."""
    frames = {
        "bad_byte": b"\x00",
        "lying_count": lying_frame(),
        "lying_count_x5": lying_frame() * 5,
        "minimal_8mib": minimal_frame(8 * MIB),
        "minimal_32mib": minimal_frame(32 * MIB),
    }
    rows: dict[str, Callable[[], Awaitable[str]]] = {
        name: lambda data=data: send_and_wait_close(target.port, data)
        for name, data in frames.items()
    }
    rows["queries_4x"] = lambda: query_all(target.address, 4, events)
    rows["query_all"] = lambda: query_all(target.address, 1, events)
    rows["big_register"] = lambda: big_register(target.address)
    return rows


async def hostile_phase(
    target: Target,
    events: int,
    phase: Callable[[str, Callable[[], Awaitable[None]]], Awaitable[None]],
) -> dict[str, dict[str, Any]]:
    """Run every row against ``target``; ``phase`` records CPU use around each row."""
    started = time.perf_counter()
    await setup_events(target.address, events)
    elapsed = time.perf_counter() - started
    say(f"[{target.kind}]   hostile setup: {events:,} events in {elapsed:.1f} s")
    bystander = await Bystander.start(target.address)
    server = psutil.Process(target.pid)
    rows: dict[str, dict[str, Any]] = {}
    try:
        quiet_start = time.time()
        await asyncio.sleep(2)
        quiet_end = time.time()
        await bystander.caught_up(quiet_end)
        baseline_ms = bystander.worst_ms(quiet_start, quiet_end)
        say(f"[{target.kind}]   bystander worst round trip alone: {baseline_ms:.1f} ms")
        rows["none"] = {"worst_ms": round(baseline_ms, 1), "outcome": "no hostile client"}
        for name, action in actions(target, events).items():
            # Under half a core (the bystander alone makes it use less), so that a row does
            # not start while the last one's work goes on.
            await wait_idle(server, max_cores=0.5, timeout=60.0)
            _reset_peak(target.pid)
            base = _status(target.pid)["VmRSS"]
            outcome: list[str] = []
            start = time.time()

            async def body(
                action: Callable[[], Awaitable[str]] = action, outcome: list[str] = outcome
            ) -> None:
                outcome.append(await action())
                await asyncio.sleep(0.3)

            await phase(f"hostile {name}", body)
            end = time.time()
            await bystander.caught_up(end)
            peak = _status(target.pid)["VmHWM"]
            rows[name] = {
                "worst_ms": round(bystander.worst_ms(start, end), 1),
                "worst_query_ms": round(bystander.worst_ms(start, end, "query"), 1),
                "rss_base_mib": round(base / MIB, 1),
                "rss_peak_mib": round(peak / MIB, 1),
                "rss_growth_mib": round((peak - base) / MIB, 1),
                "outcome": outcome[0],
                "bystander_errors": bystander.errors_between(start, end)[:3],
            }
            say(f"[{target.kind}]   {name}: {rows[name]}")
    finally:
        await bystander.stop()
    return rows


def evaluate(rows: dict[str, dict[str, Any]], max_frame_bytes: int | None) -> dict[str, str]:
    """Each row's goal and whether it is met (tidings only: the frame limit is known)."""
    goals: dict[str, str] = {}
    frames = {"bad_byte": 1, "lying_count": 40, "lying_count_x5": 200, "minimal_8mib": 8 * MIB}
    frames["minimal_32mib"] = 32 * MIB
    for name, row in rows.items():
        if name in frames:
            accepted = (
                frames[name] if max_frame_bytes is None or frames[name] <= max_frame_bytes else 0
            )
            bound = max(GOAL_FRAME_GROWTH * accepted / MIB, 5.0)
            met = row["worst_ms"] <= GOAL_WORST_MS and row["rss_growth_mib"] <= bound
            goals[name] = (
                f"worst <= {GOAL_WORST_MS:g} ms, growth <= {bound:.0f} MiB "
                f"(2 x the frame read, at least 5 MiB): {'met' if met else 'NOT met'}"
            )
        elif name == "query_all":
            met = row["outcome"].startswith("1 x all events") and (
                row["rss_growth_mib"] <= GOAL_QUERY_GROWTH_MIB
            )
            goals[name] = (
                f"answered, growth <= {GOAL_QUERY_GROWTH_MIB:g} MiB: {'met' if met else 'NOT met'}"
            )
        elif name == "big_register":
            # Not a row of the issue: a legitimate client. Its session holds the single
            # writer while it is stored, so the bystander's registrations wait for it.
            met = row["outcome"].startswith("100,000 stored, 100,000 notified")
            goals[name] = (
                f"all stored and notified, the reader not dropped: {'met' if met else 'NOT met'}"
            )
        elif name == "queries_4x":
            met = row["outcome"].startswith("4 x all events")
            goals[name] = f"all answered, registrations go on: {'met' if met else 'NOT met'}"
    return goals


def markdown(result: dict[str, Any]) -> list[str]:
    """The hostile phase's section of server.md."""
    hostile = result.get("hostile") or {}
    if not hostile:
        return []
    lines = [
        "",
        "## Hostile and careless clients",
        "",
        "One hostile connection at a time; a bystander (hat-event 0.8.5 client, own process) "
        "registers one event and queries it back in a loop (10 ms pause). Worst: the "
        "bystander's longest round trip from the row's start until 0.3 s after it ended. "
        "Peak: the server's VmHWM during the row (reset before it); growth: peak minus the "
        "RSS at the row's start.",
        "",
        "| server | row | what the client sent | bystander worst ms | of its queries "
        "| peak RSS MiB | growth MiB | what happened | goal |",
        "|---|---|---|---:|---:|---:|---:|---|---|",
    ]
    for kind, data in hostile.items():
        for name, row in data["rows"].items():
            lines.append(
                f"| {kind} | {name} | {ROWS.get(name, '-')} | {row['worst_ms']} | "
                f"{row.get('worst_query_ms', '')} | "
                f"{row.get('rss_peak_mib', '')} | {row.get('rss_growth_mib', '')} | "
                f"{row['outcome']}"
                + (
                    f"; bystander errors: {row['bystander_errors']}"
                    if row.get("bystander_errors")
                    else ""
                )
                + f" | {data['goals'].get(name, '')} |"
            )
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the bystander process of the hostile phase")
    parser.add_argument("--bystander", required=True, metavar="ADDRESS")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(bystander_main(parser.parse_args().bystander))
