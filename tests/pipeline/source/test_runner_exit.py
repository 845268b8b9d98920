"""Spark's streaming source runner ends quietly when the JVM closes its socket at a stop.

The race itself (the runner reading the socket's end before the JVM ends the process) shows
only on a busy machine, now and then; these tests play the runner instead: a real Python
process whose ``__main__`` has the runner's file name, failing the way PySpark's runner does
(an ``EOFError`` from the socket, then a broken pipe while reporting it), and failing
otherwise.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tidings.pipeline.source.runner_exit import RUNNER, closed_by_the_jvm

_PLAY = """
from tidings.pipeline.source.runner_exit import quiet_when_the_jvm_closes
quiet_when_the_jvm_closes()
quiet_when_the_jvm_closes()  # a second reader in the same process changes nothing
try:
    raise EOFError
except EOFError:
    {fail}
"""


def _play(tmp_path: Path, name: str, fail: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / name
    script.write_text(_PLAY.format(fail=fail))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)


def test_the_jvm_closing_the_socket_ends_the_runner_without_a_traceback(
    tmp_path: Path,
) -> None:
    done = _play(tmp_path, RUNNER, "raise BrokenPipeError(32, 'Broken pipe')")
    assert done.returncode == 1
    assert done.stderr == ""


@pytest.mark.parametrize(
    ("name", "fail"),
    [
        (RUNNER, "raise ValueError('a real failure of the source')"),
        ("some_other_program.py", "raise BrokenPipeError(32, 'Broken pipe')"),
    ],
    ids=["another-error", "another-program"],
)
def test_every_other_failure_keeps_its_traceback(tmp_path: Path, name: str, fail: str) -> None:
    done = _play(tmp_path, name, fail)
    assert done.returncode == 1
    assert "Traceback" in done.stderr
    assert fail.split("(")[0].removeprefix("raise ") in done.stderr


def test_only_an_end_of_the_socket_counts() -> None:
    end = EOFError()
    assert closed_by_the_jvm(end)
    pipe = BrokenPipeError()
    pipe.__context__ = end
    assert closed_by_the_jvm(pipe)
    assert not closed_by_the_jvm(BrokenPipeError())
    wrapped = RuntimeError()
    wrapped.__context__ = end
    assert not closed_by_the_jvm(wrapped)
    assert not closed_by_the_jvm(None)
