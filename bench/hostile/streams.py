"""The streams part (the default): one ``tidings server`` with an Eventer over TLS and an
FTN18 stream, two bystanders (hat's client over TLS, an FTN18 caller), the attacks of
:mod:`.attacks`. Writes ``bench/results/hostile.json`` and ``.md``."""

from __future__ import annotations

import ssl
import sys
from pathlib import Path
from typing import Any

from bench.harness.machine import machine_text
from bench.harness.processes import TIDINGS, ServerProcess, free_port, local_address
from bench.hostile.attacks import ATTACKS, Target, stream_attacks
from bench.hostile.runner import SCALES, attack_table, run_attacks
from bench.server.hostile import Bystander
from bench.streams.workload import CREDS, EVENT_TYPE, FTN18_TYPE, PASSWORD, USER
from tests.support.certificates import TlsSetup
from tidings.config.passwords import hash_password

#: The report's name (``bench/results/<NAME>.json``).
NAME = "hostile"


def server(work: Path, tls: TlsSetup) -> tuple[ServerProcess, dict[str, int]]:
    """``tidings server`` with an Eventer over TLS and a stream with metrics."""
    ports = {"eventer": free_port(), "stream": free_port(), "metrics": free_port()}
    config = {
        "type": "event",
        "backend": {"module": "tidings.server.backends.sqlite", "db_path": str(work / "e.db")},
        "engine": {"server_id": 1},
        "eventer_server": {
            "address": local_address(ports["eventer"], "ssl+sbs"),
            "tls": tls.server_tls().model_dump(exclude_none=True),
        },
        "metrics": {"port": ports["metrics"]},
        "stream_users": {USER: {"password_hash": hash_password(PASSWORD)}},
        "streams": [
            {
                "name": "hostile",
                "port": ports["stream"],
                "path": "/",
                "types": {FTN18_TYPE: list(EVENT_TYPE)},
                "metrics": True,
            }
        ],
    }
    return ServerProcess([*TIDINGS, "server"], work / "server", config, ports), ports


def metrics_url(ports: dict[str, int]) -> str:
    return f"http://127.0.0.1:{ports['metrics']}/metrics"


async def run(work: Path, scale: str, only: list[str]) -> dict[str, Any]:
    """Serve, start the bystanders, run the attacks named in ``only`` (none: all)."""
    count, hold = SCALES[scale]
    tls = TlsSetup(work / "tls")
    proc, ports = server(work, tls)
    proc.start(60)
    assert proc.proc is not None
    client_tls = ssl.create_default_context(cafile=str(tls.ca.cert))
    url = f"http://127.0.0.1:{ports['stream']}/"
    target = Target(ports["stream"], url, ports["eventer"], client_tls, CREDS, count, hold)
    stream_cmd = [sys.executable, "-m", "bench.hostile.bystander", target.ws_url, CREDS]
    bystanders: dict[str, Bystander] = {}
    try:
        bystanders["eventer"] = await Bystander.start(local_address(ports["eventer"], "ssl+sbs"))
        bystanders["stream"] = await Bystander.start(url, stream_cmd)
        running = proc.proc
        rows = await run_attacks(
            lambda: running.pid,
            lambda: running.poll() is None,
            bystanders,
            stream_attacks(target, only),
            metrics_url(ports),
        )
    finally:
        for bystander in bystanders.values():
            await bystander.stop()
        proc.stop()
    return {"part": "streams", "scale": scale, "count": count, "hold_s": hold, "rows": rows}


def markdown(result: dict[str, Any], machine: dict[str, Any]) -> str:
    lines = [
        "# Hostile clients: streams and TLS",
        "",
        machine_text(machine),
        "",
        f"Scale `{result['scale']}`: {result['count']:,} connections or requests per attack, "
        f"slow and idle ones held {result['hold_s']:g} s. Round trips in ms, during the attack "
        "and 0.3 s after; growth: the server's peak RSS minus its RSS at the start.",
        "",
        *attack_table(result["rows"], ATTACKS, ["eventer", "stream"]),
    ]
    return "\n".join(lines) + "\n"
