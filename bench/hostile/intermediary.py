"""The intermediary part: a ``tidings server`` (the streams part's, its Eventer over TLS), a
spatial publisher (``tidings intermediary simulate``) and a ``tidings intermediary serve``
following both, over TLS with subscribers and grants, a domain table fed by row events, as
subprocesses; one bystander (:mod:`.intermediary_bystander`: an event registered at the
server, received through the intermediary); the attacks of :mod:`.intermediary_attacks`.
Writes ``bench/results/hostile-intermediary.json`` and ``.md``.

The intermediary's refusals are read from its metrics endpoint (``metrics: {port, address}``
in its section) when its configuration accepts one; an intermediary that refuses the key is
started without it, and its refusals are ``n/a``.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hat.event import eventer

from bench.harness.machine import machine_text
from bench.harness.processes import TIDINGS, ServerProcess, free_port, local_address
from bench.harness.progress import say
from bench.hostile import streams
from bench.hostile.intermediary_attacks import ATTACKS, Target, intermediary_attacks, row_event
from bench.hostile.intermediary_bystander import TYPE as BYSTANDER_TYPE
from bench.hostile.runner import SCALES, attack_table, run_attacks
from bench.server.hostile import Bystander
from tests.support.certificates import TlsSetup
from tidings.config.passwords import hash_password, hash_token, new_token

#: The report's name (``bench/results/<NAME>.json``).
NAME = "hostile-intermediary"
#: The spatial publisher's agents and world (side).
AGENTS, WORLD = 10_000, 1000.0
#: Rows of the domain table the SQL views read.
ROWS = 2_000
BYSTANDER, BYSTANDER_PASSWORD = "bystander", "bystander-password"
ALIVE = "intermediary_alive"
#: How long the bystander may take to be served again by a restarted intermediary.
RESTART_S = 60.0


def publisher(work: Path) -> tuple[ServerProcess, str]:
    """``tidings intermediary simulate``: the spatial upstream region subscriptions need."""
    port = free_port()
    command = [*TIDINGS, "intermediary", "simulate", "--agents", str(AGENTS)]
    command += ["--world", str(WORLD), "--listen", f"127.0.0.1:{port}"]
    proc = ServerProcess(command, work / "spatial", {}, {"spatial": port}, config_option=None)
    return proc, f"ws://127.0.0.1:{port}/"


def section(
    ports: dict[str, int], eventer_port: int, spatial: str, tls: TlsSetup, token: str
) -> dict[str, Any]:
    """The ``intermediary:`` section: TLS, no anonymous clients, a bystander that may see its
    own events only, an attacker granted everything, table ``item``, the spatial upstream,
    and the metrics endpoint."""
    return {
        "listen": f"127.0.0.1:{ports['live']}",
        "tls": tls.server_tls().model_dump(exclude_none=True),
        "event_server": local_address(eventer_port, "ssl+sbs"),
        "event_server_tls": {"ca_file": str(tls.ca.cert)},
        "row_type_prefix": ["db"],
        "tables": {
            "item": {
                "columns": {"id": "integer", "n": "integer", "city": "text"},
                "keyed_by": "id",
            }
        },
        "anonymous": {"allowed_from": "nowhere"},
        "subscribers": {
            BYSTANDER: {
                "password_hash": hash_password(BYSTANDER_PASSWORD),
                "events": [[*BYSTANDER_TYPE, "*"]],
            },
            "attacker": {
                "token_hash": hash_token(token),
                "events": [["*"]],
                "tables": ["*"],
                "regions": "*",
            },
        },
        "spatial": {"upstream": spatial, "world_lo": [0, 0], "world_hi": [WORLD, WORLD]},
        "metrics": {"port": ports["metrics"], "address": "127.0.0.1"},
    }


def start_intermediary(work: Path, config: dict[str, Any], ports: dict[str, int]) -> ServerProcess:
    """Start ``tidings intermediary serve`` on ``config``; if it refuses the ``metrics``
    key (an intermediary without a metrics endpoint), start it again without."""
    command = [*TIDINGS, "intermediary", "serve"]
    proc = ServerProcess(
        command, work / "live", {"intermediary": config}, ports, ["live"], config_option="-c"
    )
    try:
        proc.start(60)
        return proc
    except Exception:
        if "metrics" not in proc.log_tail():
            raise
    say("the intermediary refuses the metrics key: refusals are not counted (n/a)")
    del config["metrics"]
    proc = ServerProcess(
        command, work / "live2", {"intermediary": config}, ports, ["live"], config_option="-c"
    )
    proc.start(60)
    return proc


async def restart(live: ServerProcess, bystander: Bystander) -> None:
    """A fresh intermediary on the same ports, so that an attack meets none of the one
    before: its connections (still holding their address's seats while they close), its
    throttled address, its memory. Returns once the bystander (which reconnects by itself)
    made a round trip through the new one."""
    live.stop()
    live.start(60)
    started = time.time()
    await bystander.caught_up(started, timeout=RESTART_S)
    if not any(trip[0] >= started for trip in bystander.trips):
        raise RuntimeError(f"the bystander was not served {RESTART_S:g} s after a restart")


async def fill_table(address: str) -> None:
    """ROWS rows of table ``item``, as row-change events."""
    client = await eventer.connect(address, [])
    try:
        for start in range(0, ROWS, 500):
            batch = [
                row_event(i, {"id": i, "n": i, "city": f"c{i % 7}"})
                for i in range(start, min(ROWS, start + 500))
            ]
            await client.register_with_response(batch)
    finally:
        await client.async_close()


async def run(work: Path, scale: str, only: list[str]) -> dict[str, Any]:
    """Start the parts, fill the table, start the bystander, run the attacks named in
    ``only`` (none: all)."""
    count, hold = SCALES[scale]
    tls = TlsSetup(work / "tls")
    server, server_ports = streams.server(work, tls)
    spatial, spatial_url = publisher(work)
    ports = {"live": free_port(), "metrics": free_port()}
    token = new_token()
    config = section(ports, server_ports["eventer"], spatial_url, tls, token)
    eventer_address = local_address(server_ports["eventer"], "ssl+sbs")
    started: list[ServerProcess] = []
    bystander: Bystander | None = None
    try:
        for proc in (server, spatial):
            proc.start(60)
            started.append(proc)
        await fill_table(eventer_address)
        live = start_intermediary(work, config, ports)
        started.append(live)
        metrics = f"http://127.0.0.1:{ports['metrics']}/metrics" if "metrics" in config else None
        url = f"wss://127.0.0.1:{ports['live']}/"
        login = f"{BYSTANDER}:{BYSTANDER_PASSWORD}"
        command = [sys.executable, "-m", "bench.hostile.intermediary_bystander"]
        command += [url, str(tls.ca.cert), login, eventer_address]
        bystander = await Bystander.start(url, command)
        client_tls = ssl.create_default_context(cafile=str(tls.ca.cert))
        target = Target(
            url,
            ports["live"],
            client_tls,
            token,
            BYSTANDER,
            eventer_address,
            count,
            hold,
            ([0.0, 0.0], [WORLD, WORLD]),
        )
        every = intermediary_attacks(target)
        chosen = {name: every[name] for name in ATTACKS if not only or name in only}
        watched = bystander

        async def fresh() -> None:
            await restart(live, watched)

        def process() -> subprocess.Popen[bytes]:
            assert live.proc is not None
            return live.proc

        rows = await run_attacks(
            lambda: process().pid,
            lambda: process().poll() is None,
            {"bystander": bystander},
            chosen,
            metrics,
            ALIVE,
            fresh,
        )
    finally:
        if bystander is not None:
            await bystander.stop()
        for proc in reversed(started):
            proc.stop()
    return {
        "part": "intermediary",
        "scale": scale,
        "count": count,
        "hold_s": hold,
        "agents": AGENTS,
        "rows_in_table": ROWS,
        "refusals_counted": metrics is not None,
        "rows": rows,
    }


def markdown(result: dict[str, Any], machine: dict[str, Any]) -> str:
    counted = (
        "the change of every `tidings_*refus*` counter of its metrics endpoint"
        if result["refusals_counted"]
        else "n/a: this intermediary has no metrics endpoint (its configuration refused `metrics`)"
    )
    lines = [
        "# Hostile clients: the intermediary",
        "",
        machine_text(machine),
        "",
        f"Scale `{result['scale']}`: N = {result['count']:,} connections or requests per "
        f"attack, idle ones held {result['hold_s']:g} s; {result['agents']:,} moving agents "
        f"upstream, {result['rows_in_table']:,} rows in table `item`. The bystander's round "
        "trip (ms): an event registered at the server until it arrives through the "
        "intermediary, during the attack and 0.3 s after; growth: the intermediary's peak "
        f"RSS minus its RSS at the start; refusals: {counted}.",
        "",
        *attack_table(result["rows"], ATTACKS, ["bystander"], ALIVE),
    ]
    return "\n".join(lines) + "\n"
