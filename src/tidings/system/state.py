"""Where ``tidings run`` keeps what ``tidings status`` reads: its run directory.

By default ``.tidings/`` beside the configuration file; ``--run-dir`` (or
``$TIDINGS_RUN_DIR``) chooses another, for a file in a directory the deployment may not
write (``/etc/tidings``). In it, per configuration file (named by the file's stem):

- ``run-<stem>.json``, the state: the supervisor's pid and, per part, its pid, state,
  restarts and since when. It is replaced atomically (written beside, then renamed), so a
  reader never sees half of it.
- ``run-<stem>.lock``, held (``flock``) by the supervisor while it runs, so that a second
  ``tidings run`` of the same file is refused at once instead of fighting the first over
  ports and the state. The kernel releases the lock with the process, however it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidings.errors import TidingsError

RUN_DIR_ENV = "TIDINGS_RUN_DIR"


@dataclass(frozen=True)
class RunFiles:
    """The run directory's files for one configuration file."""

    directory: Path
    state: Path
    lock: Path

    @classmethod
    def of(cls, config_path: Path, run_dir: Path | None = None) -> RunFiles:
        """The files of ``config_path``'s supervisor, in ``run_dir`` (default: ``.tidings``
        beside the file)."""
        resolved = config_path.resolve()
        directory = (run_dir or resolved.parent / ".tidings").resolve()
        return cls(
            directory,
            directory / f"run-{resolved.stem}.json",
            directory / f"run-{resolved.stem}.lock",
        )


@contextlib.contextmanager
def holding_run_lock(files: RunFiles, config_path: Path) -> Iterator[None]:
    """Hold the lock of ``config_path``'s supervisor while the block runs; a one-line
    :class:`TidingsError` if the run directory cannot be written or another supervisor of
    the file runs (naming its pid)."""
    try:
        files.directory.mkdir(parents=True, exist_ok=True)
        handle = files.lock.open("a+")
    except OSError as exc:
        raise TidingsError(
            f"run directory {files.directory}: cannot be written ({exc.strerror or exc}); "
            f"choose another with --run-dir or ${RUN_DIR_ENV}"
        ) from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            pid = handle.read().strip() or "unknown"
            raise TidingsError(
                f"tidings run is already running {config_path} (pid {pid}, lock {files.lock}); "
                "stop it first"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield


def write_state(files: RunFiles, state: dict[str, Any]) -> None:
    """Replace the state file with ``state`` (atomically)."""
    temporary = files.state.with_suffix(".tmp")
    temporary.write_text(json.dumps(state, indent=2))
    temporary.replace(files.state)


def read_state(files: RunFiles) -> dict[str, Any] | None:
    """The state the supervisor last wrote, None if it never ran there. ``running`` says
    whether the supervisor is alive, and each part's ``up`` whether it is up now (a part of a
    supervisor that is gone is down)."""
    try:
        state: dict[str, Any] = json.loads(files.state.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TidingsError(f"cannot read the supervisor's state {files.state}: {exc}") from None
    pid = state.get("supervisor_pid")
    alive = isinstance(pid, int) and _alive(pid)
    state["running"] = alive
    for part in state.get("parts", {}).values():
        part["up"] = alive and part.get("state") == "up"
    return state


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
