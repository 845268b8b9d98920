"""The webhook tests' endpoint as a process (:mod:`tests.targets.kinds.webhook_server`) on a
fixed port, killed and started again there, and what it was sent, read from its log."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.harness.processes import free_port, wait_for_port

MODULE = "tests.targets.kinds.webhook_server"
ROOT = Path(__file__).resolve().parents[3]


class HookServer:
    """The test endpoint as a process on a fixed port: killed and started again there."""

    def __init__(self, directory: Path, tls: tuple[Path, Path] | None = None) -> None:
        self.port = free_port()
        self.log = directory / f"hook-{self.port}.jsonl"
        self.log.touch()
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> None:
        extra = [str(p) for p in self.tls] if self.tls else []
        self.process = subprocess.Popen(
            [sys.executable, "-m", MODULE, str(self.port), str(self.log), *extra],
            cwd=ROOT,
        )
        wait_for_port(self.port, 30, process=self.process)

    def kill(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.process = None

    def requests(self, ids: set[str] | None = None) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [r for r in lines if ids is None or r["id"] in ids]
