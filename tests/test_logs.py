"""tidings' structured logs: one JSON object per line, stamped to the millisecond, with each
call's ``extra`` fields."""

from __future__ import annotations

import json
import logging
import re

from tidings.logs import JsonFormatter


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
