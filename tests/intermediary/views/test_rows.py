"""The row-change event convention (producer helpers and the consumer's parsing) and the
catalog's key declarations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tidings.db import make_engine
from tidings.errors import IntermediaryError
from tidings.intermediary.views.rows import (
    RowChange,
    emit_deleted,
    emit_row,
    parse_row_change,
    row_server_type,
)
from tidings.intermediary.views.sqlviews import Catalog
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import outbox_event


def test_the_helpers_emit_the_convention_and_parsing_reads_it_back(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    with Outbox(engine).transaction() as tx:
        emit_row(tx, "Users", 7, {"id": 7, "Name": "a"})
        emit_deleted(tx, "users", 7)
        emit_row(tx, "lines", [1, "x"], {"qty": 3})
    with engine.connect() as conn:
        logged = conn.execute(select(outbox_event).order_by(outbox_event.c.seq)).all()
    assert [r.event_type for r in logged] == ["rows.users", "rows.users", "rows.lines"]
    # One row's changes share a partition key, so they stay in order.
    assert [r.partition_key for r in logged] == [
        "rows.users:7",
        "rows.users:7",
        'rows.lines:[1, "x"]',
    ]
    # What is logged is the CloudEvents envelope the outbox wraps the payload in.
    p1, p2, p3 = (json.loads(r.payload) for r in logged)
    assert parse_row_change(p1, ("id",)) == RowChange((7,), {"id": 7, "name": "a"})
    assert parse_row_change(p2, ("id",)) == RowChange((7,), None)
    # A composite key fills the row's key columns.
    assert parse_row_change(p3, ("order_id", "sku")) == RowChange(
        (1, "x"), {"qty": 3, "order_id": 1, "sku": "x"}
    )
    assert row_server_type(["db"], "Users") == ("db", "rows.users")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([1], "expected an object with a key"),
        ({"row": {}}, "expected an object with a key"),
        ({"key": [1, 2], "row": {}}, "one plain value per key column"),
        ({"key": None, "row": {}}, "one plain value per key column"),
        ({"key": {"a": 1}, "row": {}}, "one plain value per key column"),
        ({"key": 1}, "either a row object or deleted: true"),
        ({"key": 1, "row": {}, "deleted": True}, "either a row object or deleted: true"),
        ({"key": 1, "row": {"id": 2}}, "the row's id is 2, its key says 1"),
    ],
)
def test_malformed_row_changes_are_named(payload: Any, message: str) -> None:
    with pytest.raises(IntermediaryError, match=message):
        parse_row_change(payload, ("id",))


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"orders": "id"}, "not a table"),
        ({"users": "nope"}, "must name columns of it"),
        ({"users": []}, "must name columns of it"),
    ],
)
def test_a_bad_key_declaration_is_refused(keys: dict[str, Any], message: str) -> None:
    with pytest.raises(IntermediaryError, match=message):
        Catalog.from_mapping({"users": ["id", "name"]}, keys=keys)


def test_declared_keys_are_lowercase_and_an_undeclared_one_is_an_error() -> None:
    catalog = Catalog.from_mapping({"Users": ["ID", "name"], "t": ["a"]}, keys={"USERS": "Id"})
    assert catalog.key("users") == ("id",)
    with pytest.raises(IntermediaryError, match="table 't' has no key column declared"):
        catalog.key("t")
