"""How a Spark job's tasks get the configuration, and see changes to it.

The driver passes the validated configuration as JSON in the data source options, and the
path of the YAML file it came from, if any. Tasks re-read the file when it changed and take
its ``routing`` section, so a routing change takes effect on the next micro-batch (patent
[0055]). Everything else (database, targets, relay) stays as the job started with it: a
task must never start writing statuses to another database because an editor left the file
half-written. An empty or invalid file is reported and the last good routing stays.

A file that is *missing* or cannot be read is an error (:class:`ConfigError`) that fails the
task, and with it the batch: on a Spark cluster it means the path does not resolve on that
executor's host, and falling back to the routing the driver read at start would have some
executors route by an old table while the operator's changes reach the others. Only a file
that reappears within a moment is waited for: an editor that saves by moving the old file
away or deleting it before writing the new one leaves the path empty that long (one that
writes a temporary file and renames it over the old one never does).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import tidings.targets.registry  # noqa: F401 - enters the target kinds a configuration names
from tidings.config import RoutingConfig, TidingsConfig, load_config_file
from tidings.errors import ConfigError

log = logging.getLogger(__name__)
_lock = threading.Lock()
_file_cache: dict[str, tuple[float, RoutingConfig]] = {}
#: Pauses (seconds, 0.75 in all) before a missing file counts as missing: far longer than
#: an editor's delete-then-write save takes, short enough not to stall a batch for long.
MISSING_FILE_PAUSES = (0.05, 0.1, 0.2, 0.4)
_T = TypeVar("_T")


def job_options(config: TidingsConfig, config_path: str | None) -> dict[str, str]:
    """The data source options that carry the configuration to every task."""
    return {
        "config_json": config.model_dump_json(),
        "config_path": os.path.abspath(config_path) if config_path else "",
        # What planning the job's batches needs, as plain values: the streaming source
        # runner (a new process per query) and the replay's planner then start without
        # loading the configuration models and every target kind (0.2 s each, measured).
        "database_url": config.database.url,
        "partitions": str(config.relay.partitions),
        "max_events_per_batch": str(config.relay.max_events_per_batch),
        # The tasks' Python workers log at the driver's level (their start-up line among
        # them: tidings.pipeline.source.task).
        "log_level": logging.getLevelName(logging.getLogger("tidings").getEffectiveLevel()),
    }


def started_config(options: Mapping[str, str]) -> TidingsConfig:
    """The configuration the job started with, as the driver passed it: the base that
    :func:`job_config` takes the file's routing into. (The driver's own steps and the
    source's planning read the plain values of :func:`job_options` instead: the database
    URL, which a file change never alters, so they neither decode this nor read the file.)"""
    return _decoded(options["config_json"])


@functools.lru_cache(maxsize=8)
def _decoded(config_json: str) -> TidingsConfig:
    """Decoded once per worker and job: every task of a micro-batch needs it
    (3 ms each, measured), and a configuration cannot change once validated (frozen)."""
    return TidingsConfig.model_validate_json(config_json)


def job_config(options: Mapping[str, str]) -> TidingsConfig:
    """The configuration in force for this task.

    Raises :class:`ConfigError` if the job names a configuration file that this host cannot
    read (see the module's docstring).
    """
    base = started_config(options)
    path = options.get("config_path") or ""
    if not path:
        return base
    mtime = _patiently(path, lambda: os.stat(path).st_mtime)
    with _lock:
        cached = _file_cache.get(path)
        if cached is None or cached[0] != mtime:
            routing = _routing_from_file(path, cached[1] if cached else base.routing)
            cached = _file_cache[path] = (mtime, routing)
    return base.model_copy(update={"routing": cached[1]})


def _routing_from_file(path: str, last_good: RoutingConfig) -> RoutingConfig:
    content = _patiently(path, lambda: _read(path))
    try:
        if not content.strip():
            raise ConfigError(f"{path} is empty")
        return load_config_file(path).routing
    except (ConfigError, UnicodeDecodeError) as exc:
        log.error("configuration file changed but is unusable, keeping the last routes: %s", exc)
        return last_good


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _patiently(path: str, action: Callable[[], _T]) -> _T:
    """``action`` on the file at ``path``, tried again while the file is missing for a moment
    (:data:`MISSING_FILE_PAUSES`); a file still missing, or unreadable, is a ConfigError."""
    pauses = iter(MISSING_FILE_PAUSES)
    while True:
        try:
            return action()
        except FileNotFoundError as exc:
            pause = next(pauses, None)
            if pause is None:
                raise _unreadable(path, exc) from None
            time.sleep(pause)
        except OSError as exc:
            raise _unreadable(path, exc) from None


def _unreadable(path: str, exc: OSError) -> ConfigError:
    return ConfigError(
        f"configuration file {path!r} cannot be read on host {socket.gethostname()!r}: "
        f"{exc.strerror or exc}; Spark tasks re-read it for routing changes, so it must be "
        "at this path on the driver and on every executor host (shared storage, or a copy "
        "at the same path)"
    )
