"""``tidings`` run as a user runs it, in a subprocess of this interpreter, and the check that
a refused command ended as the CLI promises: exit 2, one line on stderr, no traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping


def run_tidings(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``tidings ARGS``, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "tidings.cli", *args],
        capture_output=True,
        text=True,
        env=None if env is None else dict(env),
        timeout=timeout,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused command wrote on stderr (asserting exit 2 and no traceback)."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]
