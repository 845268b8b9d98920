"""Where a deployment writes on this machine, and whether it can: checked by ``tidings config
check`` before any part starts, so that an unwritable checkpoint directory or SQLite file is
one line naming the path, not 195 lines of Java from a relay that failed to start.

A local path is writable if a file can be made beside it (in it, for a directory), or in
the nearest directory that exists above it (the part creates what is missing); the check
makes one, for real, and removes it. URIs (``s3a://``,
``hdfs://``) and other databases are the cluster's business and are left alone.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tidings.config import TidingsConfig

_SQLITE = "sqlite:///"


def _sqlite_path(url: str) -> Path | None:
    return Path(url.removeprefix(_SQLITE)) if url.startswith(_SQLITE) else None


def _local(location: str | Path) -> Path | None:
    text = str(location)
    return None if "://" in text else Path(text)


def _can_write_in(directory: Path) -> str | None:
    """Why a file cannot be made in ``directory`` (tried for real, and removed: permission
    bits say nothing to root or of a read-only mount), or None."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".tidings-check-"):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def _problem(path: Path, what: str, *, is_file: bool) -> str | None:
    """Why ``path`` cannot be written, or None."""
    if path.exists():
        if is_file and path.is_dir():
            return f"{what} {path}: is a directory, not a file"
        if not is_file and not path.is_dir():
            return f"{what} {path}: is a file, not a directory"
        if is_file and not os.access(path, os.W_OK):
            return f"{what} {path}: cannot be written (permission denied)"
        why = _can_write_in(path.parent if is_file else path)
        return None if why is None else f"{what} {path}: cannot be written ({why})"
    above = path.parent
    while not above.exists():
        above = above.parent
    if not above.is_dir():
        return f"{what} {path}: cannot be created ({above} is a file)"
    why = _can_write_in(above)
    return None if why is None else f"{what} {path}: cannot be created in {above} ({why})"


def unwritable_paths(config: TidingsConfig) -> list[str]:
    """One line per local file or directory the deployment must write and cannot."""
    places: list[tuple[str, Path | None, bool]] = [
        ("database.url", _sqlite_path(config.database.url), True),
        ("relay.checkpoint_dir", _local(config.relay.checkpoint_dir), False),
    ]
    if config.housekeeping.mode == "archive":
        places.append(("housekeeping.archive_dir", _local(config.housekeeping.archive_dir), False))
    for name, target in config.targets.items():
        url = getattr(target, "url", None)
        if isinstance(url, str):
            places.append((f"targets.{name}.url", _sqlite_path(url), True))
    for name, server in config.servers.items():
        options = server.backend.options()
        if "db_path" in options:
            places.append(
                (f"servers.{name}.backend.db_path", server.resolve(str(options["db_path"])), True)
            )
    problems = []
    for what, path, is_file in places:
        if path is not None and (problem := _problem(path, what, is_file=is_file)):
            problems.append(problem)
    return problems
