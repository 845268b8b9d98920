"""One member of a cluster of intermediaries in its own OS process, started by a
:class:`.process_cluster.ProcessCluster` (an overloaded intermediary starts
another process and hands subscriptions over).

Run as ``python -m tidings.intermediary.cluster.member_process`` with a JSON plan on stdin's
first line: ``{"name", "directory": PATH, "partition": {"grid": [nx, ny(, nz)], "world": [[lo],
[hi]]} or {"hash": n}, "dim", "upstream": URL, "host", "port" (0: any free one), "round_s",
"report_s"}``. The member is a :class:`.member.ClusterServer` fed by a
:class:`.feed.remote.RemoteFeed`; it follows the shared directory before every round (slots
moved by the supervisor start handovers) and reports its load there every ``report_s``
(:meth:`.directory.Directory.report`). It joins the directory with its URL, prints ``ready URL``
and serves until SIGTERM or stdin closes (exit 0), or until its upstream connection ends (exit
3). One that cannot open the directory or reach its upstream prints ``error`` and why, and exits
2.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from typing import Any

from tidings.errors import IntermediaryError
from tidings.intermediary.cluster.directory import Directory, Load
from tidings.intermediary.cluster.member import ClusterServer
from tidings.intermediary.cluster.responsibility import partition_from
from tidings.intermediary.feed.remote import RemoteFeed
from tidings.tasks import stop_task

log = logging.getLogger(__name__)


async def _report(member: ClusterServer, directory: Directory, every_s: float) -> None:
    """The member's load in the directory every ``every_s`` (frames/s over the interval)."""
    frames, since = member.frames_served, time.monotonic()
    while True:
        await asyncio.sleep(every_s)
        now = time.monotonic()
        rate = (member.frames_served - frames) / max(now - since, 1e-9)
        frames, since = member.frames_served, now
        load = Load(member.name, member.subscriptions(), rate, member.handing(), time.time())
        try:
            directory.report(load)
        except IntermediaryError as exc:  # a busy directory: the next report will do
            log.warning("%s: %s", member.name, exc)


async def _stdin_closed() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.readline():
        pass


async def main(plan: dict[str, Any]) -> int:
    try:
        directory = Directory(plan["directory"])
        feed = await RemoteFeed.connect(plan["upstream"], plan["dim"])
    except IntermediaryError as exc:  # the supervisor shows what this line says
        print("error", exc, flush=True)
        return 2
    member = ClusterServer(
        plan["name"],
        feed,
        directory,
        partition_from(plan["partition"]),
        dim=plan["dim"],
        tick_s=plan["round_s"],
        source=feed.take,
        remote_feed=True,
    )
    try:
        await member.start(plan["host"], plan.get("port", 0))
    except IntermediaryError as exc:  # its address is taken: the supervisor says so
        print("error", exc, flush=True)
        await feed.aclose()
        return 2
    directory.join(member.name, member.url)
    print("ready", member.url, flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    tasks = [
        loop.create_task(_report(member, directory, plan["report_s"])),
        loop.create_task(_stdin_closed()),
        loop.create_task(stop.wait()),
        lost := loop.create_task(feed.closed.wait()),
    ]
    try:
        await asyncio.wait(tasks[1:], return_when=asyncio.FIRST_COMPLETED)
        upstream_lost = lost.done()
    finally:
        for task in tasks:
            await stop_task(task)
        await member.aclose()
        await feed.aclose()
        directory.close()
    if upstream_lost:
        print(f"{member.name}: upstream ended: {feed.closed_reason}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    sys.exit(asyncio.run(main(json.loads(sys.stdin.readline()))))
