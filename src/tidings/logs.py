"""Structured logs: one JSON object per line, with the ``extra`` fields of each call."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, TextIO

_STANDARD = set(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            # Milliseconds: a relay's takeover is read from these lines, step by step.
            "ts": f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')}.{int(record.msecs):03d}",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        data.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class _CurrentStderr(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is at the time of the record (it may be replaced)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def configure_logging(level: str = "INFO") -> None:
    """Send tidings' logs as JSON lines to stderr.

    Records still propagate to the root logger, which has no handler of its own in the CLI
    (so nothing is printed twice) and lets embedding applications and tests capture them.
    """
    handler = _CurrentStderr()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("tidings")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("py4j").setLevel(logging.ERROR)
