"""``python -m bench.hostile [--scale small|full] [--only NAME ...]``: see the package's
docstring. Writes ``bench/results/hostile.json`` and ``.md``."""

from __future__ import annotations

import argparse
import asyncio
import re
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness.machine import code_version, machine_info, machine_text
from bench.harness.processes import TIDINGS, ServerProcess, free_port, local_address
from bench.harness.progress import say
from bench.harness.report import write_report
from bench.hostile.attacks import ATTACKS, Target
from bench.server.hostile import Bystander, _reset_peak, _status
from bench.streams.workload import CREDS, EVENT_TYPE, FTN18_TYPE, PASSWORD, USER
from tests.support.certificates import TlsSetup
from tidings.config.passwords import hash_password

#: (connections or requests per attack, seconds the slow and idle ones hold them).
#: Held over the streams' 10 s request head timeout, to show it.
SCALES = {"small": (200, 12.0), "full": (2000, 20.0)}
MIB = 1024 * 1024
#: Metric lines that count refusals.
REFUSALS = re.compile(r"^(tidings_\w*refus\w*)(\{[^}]*\})? (\S+)$", re.MULTILINE)


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


async def refusals(ports: dict[str, int]) -> dict[str, float]:
    """Every refusal counter of the server's metrics, the stream's included."""
    async with httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(f"http://127.0.0.1:{ports['metrics']}/metrics")).text
    return {name + labels: float(value) for name, labels, value in REFUSALS.findall(text)}


def figures(bystander: Bystander, start: float, end: float) -> dict[str, Any]:
    trips = bystander.round_trips(start, end)
    if not trips:
        return {"trips": 0, "worst_ms": round(bystander.worst_ms(start, end), 1)}
    return {
        "trips": len(trips),
        "p50_ms": round(trips[len(trips) // 2], 1),
        "p99_ms": round(trips[min(len(trips) - 1, int(len(trips) * 0.99))], 1),
        "worst_ms": round(bystander.worst_ms(start, end), 1),
        "errors": bystander.errors_between(start, end)[:3],
    }


async def run(scale: str, only: list[str]) -> dict[str, Any]:
    count, hold = SCALES[scale]
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        work = Path(tmp)
        tls = TlsSetup(work / "tls")
        proc, ports = server(work, tls)
        proc.start(60)
        assert proc.proc is not None
        pid = proc.proc.pid
        client_tls = ssl.create_default_context(cafile=str(tls.ca.cert))
        url = f"http://127.0.0.1:{ports['stream']}/"
        target = Target(ports["stream"], url, ports["eventer"], client_tls, CREDS, count, hold)
        eventer = local_address(ports["eventer"], "ssl+sbs")
        stream_cmd = [
            sys.executable,
            "-m",
            "bench.hostile.bystander",
            url.replace("http", "ws"),
            CREDS,
        ]
        bystanders: dict[str, Bystander] = {}
        rows: dict[str, Any] = {}
        try:
            bystanders["eventer"] = await Bystander.start(eventer)
            bystanders["stream"] = await Bystander.start(url, stream_cmd)
            names = ["none", *(n for n in ATTACKS if not only or n in only)]
            for name in names:
                _reset_peak(pid)
                base = _status(pid)["VmRSS"]
                before = await refusals(ports)
                start = time.time()
                if name == "none":
                    await asyncio.sleep(2)
                    outcome = "no attacker"
                else:
                    outcome = await ATTACKS[name][1](target)
                await asyncio.sleep(0.3)
                end = time.time()
                for bystander in bystanders.values():
                    await bystander.caught_up(end)
                after = await refusals(ports)
                rows[name] = {
                    "outcome": outcome,
                    "seconds": round(end - start, 1),
                    "rss_growth_mib": round((_status(pid)["VmHWM"] - base) / MIB, 1),
                    "refusals": {
                        k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)
                    },
                    "server_alive": proc.proc.poll() is None,
                    **{k: figures(b, start, end) for k, b in bystanders.items()},
                }
                say(f"hostile {name}: {rows[name]}")
                await asyncio.sleep(1)
        finally:
            for bystander in bystanders.values():
                await bystander.stop()
            proc.stop()
    return {"scale": scale, "count": count, "hold_s": hold, "rows": rows}


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
        "| attack | what | outcome | eventer p50 / p99 / worst | stream p50 / p99 / worst "
        "| growth MiB | refusals counted |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for name, row in result["rows"].items():
        what = ATTACKS[name][0] if name in ATTACKS else "bystanders alone"
        cells = [
            f"{row[k].get('p50_ms', '-')} / {row[k].get('p99_ms', '-')} / {row[k]['worst_ms']}"
            + (f" (errors: {row[k]['errors']})" if row[k].get("errors") else "")
            for k in ("eventer", "stream")
        ]
        counted = ", ".join(f"`{k}` +{v:g}" for k, v in row["refusals"].items()) or "-"
        lines.append(
            f"| {name} | {what} | {row['outcome']} | {cells[0]} | {cells[1]} | "
            f"{row['rss_growth_mib']} | {counted} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", choices=SCALES, default="full")
    parser.add_argument("--only", nargs="*", default=[], choices=list(ATTACKS))
    args = parser.parse_args()
    machine = machine_info(spark=False)
    result = asyncio.run(run(args.scale, args.only))
    result |= {"machine": machine, "code": code_version()}
    json_path, md_path = write_report("hostile", result, markdown(result, machine))
    say(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
