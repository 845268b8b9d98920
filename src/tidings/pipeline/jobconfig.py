"""How a Spark job's tasks get the configuration, and see changes to it.

The driver passes the validated configuration as JSON in the data source options, and the
path of the YAML file it came from, if any. Tasks re-read the file when it changed and take
its ``routing`` section, so a routing change takes effect on the next micro-batch (patent
[0055]). Everything else (database, targets, relay) stays as the job started with it: a
task must never start writing statuses to another database because an editor left the file
half-written. An empty or invalid file is reported and the last good routing stays.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping

import tidings.targets.registry  # noqa: F401 - enters the target kinds a configuration names
from tidings.config import RoutingConfig, TidingsConfig, load_config_file
from tidings.errors import ConfigError

log = logging.getLogger(__name__)
_lock = threading.Lock()
_file_cache: dict[str, tuple[float, RoutingConfig]] = {}


def job_options(config: TidingsConfig, config_path: str | None) -> dict[str, str]:
    """The data source options that carry the configuration to every task."""
    return {
        "config_json": config.model_dump_json(),
        "config_path": os.path.abspath(config_path) if config_path else "",
    }


def job_config(options: Mapping[str, str]) -> TidingsConfig:
    """The configuration in force for this task."""
    base = TidingsConfig.model_validate_json(options["config_json"])
    path = options.get("config_path") or ""
    if not path:
        return base
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return base
    with _lock:
        cached = _file_cache.get(path)
        if cached is None or cached[0] != mtime:
            routing = _routing_from_file(path, cached[1] if cached else base.routing)
            cached = _file_cache[path] = (mtime, routing)
    return base.model_copy(update={"routing": cached[1]})


def _routing_from_file(path: str, last_good: RoutingConfig) -> RoutingConfig:
    try:
        with open(path, encoding="utf-8") as handle:
            empty = not handle.read().strip()
        if empty:
            raise ConfigError(f"{path} is empty")
        return load_config_file(path).routing
    except (OSError, ConfigError) as exc:
        log.error("configuration file changed but is unusable, keeping the last routes: %s", exc)
        return last_good
