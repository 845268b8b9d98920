"""Structured logs: one JSON object per line, with the ``extra`` fields of each call, and
no secret in it (:func:`tidings.redaction.scrub` is the formatter's last step, so a library's
message quoting a URL with its password, or a configured token, is masked too)."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TextIO

from tidings.redaction import scrub

_STANDARD = set(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            # Milliseconds: a relay's takeover is read from these lines, step by step.
            "ts": f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')}.{int(record.msecs):03d}",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": scrub(record.getMessage()),
        }
        data.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            data["exc"] = scrub(self.formatException(record.exc_info))
        # The whole line again, for the extra fields.
        return scrub(json.dumps(data, default=str))


class _CurrentStderr(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is at the time of the record (it may be replaced)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def process_age_s() -> float:
    """Seconds since this process started (the OS's start time): the relay's start-up
    milestones carry it, so that a log alone says how long each step of a start took."""
    import psutil

    return round(time.time() - psutil.Process().create_time(), 3)


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


class OncePerCause:
    """Logs a recurring problem once per cause, not once per occurrence.

    What a peer can trigger at will (a malformed request, a request that fails) must not
    cost a log line, let alone a traceback, per request: that is a cheap flood of the disk
    and of whoever reads the logs. The first occurrence of a cause is logged in full (with
    its traceback, if any); later ones are counted, and the count goes out with the first
    occurrence ``every`` seconds or more after the last line for that cause. A peer chooses
    the causes, so at most ``max_causes`` are kept (the least recently logged is forgotten
    first: it is logged in full again when it recurs).
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        every: float = 60.0,
        max_causes: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._every = every
        self._max_causes = max_causes
        self._clock = clock
        #: cause -> (when it was last logged, occurrences since then not logged)
        self._seen: OrderedDict[Hashable, tuple[float, int]] = OrderedDict()
        self._lock = threading.Lock()

    def log(
        self,
        level: int,
        cause: Hashable,
        message: str,
        *,
        exc_info: BaseException | None = None,
        extra: Mapping[str, object] | None = None,
    ) -> bool:
        """Log ``message`` unless ``cause`` was logged less than ``every`` seconds ago (then
        count it); True if a line was written."""
        now = self._clock()
        with self._lock:
            seen = self._seen.get(cause)
            if seen is not None and now - seen[0] < self._every:
                self._seen[cause] = (seen[0], seen[1] + 1)
                return False
            self._seen[cause] = (now, 0)
            self._seen.move_to_end(cause)
            while len(self._seen) > self._max_causes:
                self._seen.popitem(last=False)
        if seen is None:
            self._logger.log(level, message, exc_info=exc_info, extra=extra)
        elif seen[1] == 0:  # back after a quiet spell: the message alone, no second traceback
            self._logger.log(level, message, extra=extra)
        else:
            fields = {**(extra or {}), "repeated": seen[1]}
            self._logger.log(
                level,
                "%s (%d more times since it was last logged, %.0f s ago)",
                message,
                seen[1],
                now - seen[0],
                extra=fields,
            )
        return True

    def failure(
        self, message: str, exc: BaseException, *, extra: Mapping[str, object] | None = None
    ) -> bool:
        """Log an unexpected error ``exc`` (with its traceback) once per place it was raised
        at: the same bug met by every request of a flood is one cause."""
        where = None
        for frame, line in traceback.walk_tb(exc.__traceback__):  # no source read: cheap
            where = (frame.f_code.co_filename, line)
        return self.log(
            logging.ERROR,
            (message, type(exc).__name__, where),
            f"{message}: {type(exc).__name__}",
            exc_info=exc,
            extra=extra,
        )
