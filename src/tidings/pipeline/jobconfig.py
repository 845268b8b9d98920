"""How a Spark job's tasks get the configuration, and see changes to it.

The driver passes the validated configuration as JSON in the data source options, and the
path of the YAML file it came from, if any. Tasks re-read the file when it changed, so a
routing change in the file takes effect on the next micro-batch (patent [0055]); a file
that became invalid is reported once and the last good configuration stays in force.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping

from tidings.config import TidingsConfig, load_config_file
from tidings.errors import ConfigError

log = logging.getLogger(__name__)
_lock = threading.Lock()
_file_cache: dict[str, tuple[float, TidingsConfig]] = {}


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
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            config = load_config_file(path)
        except ConfigError as exc:
            log.error(
                "configuration file changed but is invalid, keeping the last good one: %s", exc
            )
            config = cached[1] if cached else base
        _file_cache[path] = (mtime, config)
        return config
