"""Structured logs: one JSON object per line, stamped to the millisecond, with each call's
``extra`` fields; secrets scrubbed from every line, and a recurring problem logged once per
cause (issue 30: a peer must not flood the log at will)."""

from __future__ import annotations

import json
import logging
import re

import pytest

from tidings import redaction
from tidings.logs import JsonFormatter, OncePerCause


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _logger(caplog: pytest.LogCaptureFixture, name: str) -> logging.Logger:
    caplog.set_level(logging.INFO, logger=name)
    return logging.getLogger(name)


def test_a_cause_is_logged_once_then_counted_then_logged_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = _Clock()
    once = OncePerCause(_logger(caplog, "tests.once"), every=60.0, clock=clock)
    try:
        raise RecursionError("deep")
    except RecursionError as exc:
        error = exc
    assert once.failure("request failed", error)
    for _ in range(999):
        assert not once.failure("request failed", error)
    clock.now = 61.0
    assert once.failure("request failed", error)
    records = [r for r in caplog.records if r.name == "tests.once"]
    assert len(records) == 2
    assert records[0].getMessage() == "request failed: RecursionError"
    assert records[0].exc_info is not None  # the traceback, once
    assert records[1].exc_info is None
    assert "999 more times since it was last logged" in records[1].getMessage()


def test_different_causes_are_each_logged_and_the_oldest_is_forgotten_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    once = OncePerCause(_logger(caplog, "tests.causes"), max_causes=2, clock=_Clock())
    assert once.log(logging.WARNING, "a", "a happened")
    assert once.log(logging.WARNING, "b", "b happened")
    assert not once.log(logging.WARNING, "a", "a happened")  # counted, not logged
    assert once.log(logging.WARNING, "c", "c happened")  # "a", logged longest ago, is forgotten
    assert once.log(logging.WARNING, "a", "a happened")  # so it is logged whole again
    assert not once.log(logging.WARNING, "c", "c happened")
    messages = [r.getMessage() for r in caplog.records if r.name == "tests.causes"]
    assert messages == ["a happened", "b happened", "c happened", "a happened"]


def test_the_json_formatter_scrubs_remembered_secrets_and_url_passwords(
    forgotten_secrets: None,
) -> None:
    redaction.remember(["tok-abcdef"])
    logger = logging.getLogger("tests.scrubbed")
    try:
        raise ValueError("peer token tok-abcdef refused")
    except ValueError as exc:
        record = logger.makeRecord(
            "tests.scrubbed",
            logging.ERROR,
            __file__,
            1,
            "cannot reach %s",
            ("postgresql://u:dbpass@h/db",),
            (type(exc), exc, exc.__traceback__),
            extra={"token_seen": "tok-abcdef", "url": "amqp://guest:guestpw@rabbit"},
        )
    line = JsonFormatter().format(record)
    for secret in ("tok-abcdef", "dbpass", "guestpw"):
        assert secret not in line
    shown = json.loads(line)
    assert shown["msg"] == "cannot reach postgresql://u:***@h/db"
    assert "peer token *** refused" in shown["exc"]


def test_a_record_is_one_json_line_stamped_to_the_millisecond_with_its_fields() -> None:
    record = logging.makeLogRecord(
        {"name": "tidings.x", "levelname": "INFO", "msg": "relay %s", "args": ("started",)}
    )
    record.owner = "host:1:ab"
    line = JsonFormatter().format(record)
    data = json.loads(line)
    assert "\n" not in line
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}", data["ts"])
    assert (data["level"], data["logger"], data["msg"]) == ("info", "tidings.x", "relay started")
    assert data["owner"] == "host:1:ab"
