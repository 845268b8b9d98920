"""One member of a cluster of intermediaries in its own OS process, started by a
:class:`.process_cluster.ProcessCluster` (an overloaded intermediary starts
another process and hands subscriptions over).

Run as ``python -m tidings.intermediary.cluster.member_process`` with a JSON plan on stdin's
first line: ``{"name", "directory": PATH, "partition": {"grid": [nx, ny(, nz)], "world": [[lo],
[hi]]} or {"hash": n}, "dim", "upstream": URL, "host", "port" (0: any free one), "round_s",
"report_s", "security", "metrics"}`` (``security``, optional: :func:`member_security`'s keys;
``metrics``, optional: ``{"address", "port"}`` of its Prometheus endpoint). The member
is a :class:`.member.ClusterServer` fed by a
:class:`.feed.remote.RemoteFeed`; it follows the shared directory before every round (slots
moved by the supervisor start handovers) and reports its load there every ``report_s``
(:meth:`.directory.Directory.report`). It joins the directory with its URL, prints ``ready URL``
and serves until SIGTERM or stdin closes (exit 0), or until its upstream connection ends (exit
3). One that cannot open the directory or reach its upstream prints ``error`` and why, and exits
2; so does one whose TLS files cannot be used.

``security`` carries what a deployed tier configures (:mod:`tidings.config.intermediary_tier`):
who may subscribe (``access``, the ``subscribers:`` and ``anonymous:`` keys, whose hash
variables the member reads from the environment it inherits), its TLS (``tls``), how it
verifies the other members (``peer_tls``) and the publisher (``upstream_tls``), and the
token the members prove to each other that they are members (``peer_token``: made by the
supervisor for this run, passed on the pipe, written nowhere).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import ssl
import sys
import time
from dataclasses import dataclass
from typing import Any

from tidings.config.intermediary import tls_connect_options
from tidings.config.intermediary_access import SubscriberAccess
from tidings.config.loading import validate_config
from tidings.config.tls import TlsClientConfig, TlsServerConfig
from tidings.errors import IntermediaryError, TidingsError
from tidings.intermediary.cluster.directory import Directory, Load
from tidings.intermediary.cluster.member import ClusterServer
from tidings.intermediary.cluster.responsibility import partition_from
from tidings.intermediary.feed.remote import RemoteFeed
from tidings.intermediary.serving.access import Gatekeeper
from tidings.intermediary.serving.credentials import Credentials
from tidings.intermediary.serving.metrics import IntermediaryMetrics
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


@dataclass(frozen=True)
class Security:
    """A member's side of its plan's ``security`` (see the module docstring)."""

    access: Gatekeeper
    tls: ssl.SSLContext | None
    peer_tls: ssl.SSLContext | None
    upstream_tls: dict[str, Any]
    peer: Credentials | None

    @classmethod
    def of(cls, plan: dict[str, Any]) -> Security:
        """From the plan; a ConfigError names what cannot be used."""
        spec = plan.get("security") or {}
        access = validate_config(SubscriberAccess, spec.get("access") or {}, "access")
        token = spec.get("peer_token")
        tls = spec.get("tls") and validate_config(TlsServerConfig, spec["tls"], "tls")
        peer_tls = validate_config(TlsClientConfig, spec.get("peer_tls") or {}, "peer_tls")
        upstream_tls = spec.get("upstream_tls") and validate_config(
            TlsClientConfig, spec["upstream_tls"], "spatial.tls"
        )
        return cls(
            Gatekeeper.from_config(access, peer_token=token),
            tls.context() if tls else None,
            peer_tls.context() if tls else None,
            tls_connect_options(str(plan["upstream"]), upstream_tls or None),
            Credentials(token=token) if token else None,
        )


def member_security(
    access: SubscriberAccess,
    tls: TlsServerConfig | None,
    peer_tls: TlsClientConfig | None,
    upstream_tls: TlsClientConfig | None,
    peer_token: str,
) -> dict[str, Any]:
    """The plan's ``security`` for members of a tier configured so (JSON)."""

    def dumped(model: TlsServerConfig | TlsClientConfig | None) -> dict[str, Any] | None:
        return None if model is None else model.model_dump(mode="json")

    return {
        "access": access.model_dump(mode="json"),
        "tls": dumped(tls),
        "peer_tls": dumped(peer_tls),
        "upstream_tls": dumped(upstream_tls),
        "peer_token": peer_token,
    }


async def main(plan: dict[str, Any]) -> int:
    try:
        security = Security.of(plan)
        directory = Directory(plan["directory"])
        feed = await RemoteFeed.connect(plan["upstream"], plan["dim"], tls=security.upstream_tls)
    except TidingsError as exc:  # the supervisor shows what this line says
        print("error", str(exc).replace("\n", " "), flush=True)
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
        peer_credentials=security.peer,
        peer_tls=security.peer_tls,
        access=security.access,
        tls=security.tls,
    )
    try:
        await member.start(plan["host"], plan.get("port", 0))
    except IntermediaryError as exc:  # its address is taken: the supervisor says so
        print("error", exc, flush=True)
        await feed.aclose()
        return 2
    metrics = None
    try:
        if spec := plan.get("metrics"):
            metrics = IntermediaryMetrics(
                member, spec["address"], spec["port"], member.responsibility
            )
    except TidingsError as exc:  # its metrics port is taken: the supervisor says so
        print("error", exc, flush=True)
        await member.aclose()
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
        if metrics is not None:
            metrics.close()
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
