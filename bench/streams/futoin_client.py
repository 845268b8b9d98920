"""The FutoIn client (``tests/interop/futoin/client.js``) run to its end for one drain or
latency load, with the CPU used meanwhile."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.cpu import CpuSampler
from bench.streams.servers import Endpoint
from bench.streams.usage import measure_cpu
from bench.streams.workload import CLIENT_JS, CREDS, FUTOIN_DIR


@dataclass
class ClientRun:
    lines: list[dict[str, Any]]
    code: int
    usage: dict[str, float]
    stderr: str
    sampler: CpuSampler | None

    @property
    def done(self) -> dict[str, Any] | None:
        return next((line for line in self.lines if line.get("done")), None)

    def last(self, key: str) -> dict[str, Any] | None:
        return next((line for line in reversed(self.lines) if key in line), None)

    def problem(self) -> str:
        errors = [line for line in self.lines if "error" in line][:3]
        return f"exit {self.code}, errors {errors}, stderr {self.stderr[-500:]!r}"


def node_client(
    options: dict[str, Any], server_pid: int | None, timeout: float, prof_dir: Path | None = None
) -> ClientRun:
    """Run client.js with ``options`` to its end, with the CPU used meanwhile."""
    command = ["node"]
    if prof_dir is not None:
        command += ["--cpu-prof", f"--cpu-prof-dir={prof_dir}"]
    usage = measure_cpu(server_pid)
    sampler = CpuSampler(server_pid) if server_pid else None
    proc = subprocess.Popen(
        [*command, str(CLIENT_JS), json.dumps(options)],
        cwd=FUTOIN_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    figures = usage.stop()
    if sampler is not None:
        sampler.stop()
    lines = [json.loads(raw) for raw in out.splitlines() if raw.startswith(b"{")]
    return ClientRun(lines, proc.returncode, figures, err.decode(errors="replace"), sampler)


def rate_options(ep: Endpoint, mode: str, run: int, backlog: int, marker: int) -> dict[str, Any]:
    """The client's options for one drain: reliable consumers read the marker and the
    backlog, LIVE polls start after the marker."""
    base = {"creds": CREDS, "quiet": True, "count": backlog + 1}
    if mode == "reliable_push":
        return base | {
            "mode": "reliable",
            "url": ep.push_url,
            "component": f"PUSH{run}",
            "linger_ms": 200,
        }
    poll = base | {"mode": "poll", "url": ep.poll_url, "version": ep.poll_version}
    if mode.startswith("reliable_poll"):
        return poll | {"component": f"POLL{run}{mode[-4:].upper()}"}
    return poll | {"component": "LIVE", "last_id": str(marker), "count": backlog}
