"""Row-change events: how a domain table reaches an intermediary's SQL views (the SQL views' feed).

The convention. A service that wants a table ``t`` visible to SQL views emits, through the
outbox and in the same transaction as its domain write (so the row and its event commit
together), one event per changed row:

* type ``rows.t`` (:func:`row_event_type`), routed to an event server target; there it is
  stored as ``(*type_prefix, "rows.t")``;
* payload ``{"key": K, "row": {column: value, ...}}`` for an insert or update (the whole
  row: columns it lacks become NULL), ``{"key": K, "deleted": true}`` for a delete. ``K`` is
  the value of the table's key column (the catalog declares it), or the list of values of a
  composite key in the declared order;
* partition key ``rows.t:<K as JSON>``, so the changes of one row reach the server in the
  order they were made (the relay keeps per-key order; rows of different keys commute).

:func:`emit_row` and :func:`emit_deleted` write exactly that. On the way out the outbox's
default transformer wraps the payload in a CloudEvents envelope; :func:`parse_row_change`
accepts both the envelope (reading its ``data``) and the bare payload.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tidings.errors import IntermediaryError

ROW_TYPE_PREFIX = "rows."


class Emitter(Protocol):
    """What emits an outbox event in a transaction (:class:`tidings.OutboxTransaction`)."""

    def emit(self, event_type: str, payload: Any, **kwargs: Any) -> str: ...


def row_event_type(table: str) -> str:
    """The outbox event type of ``table``'s row changes."""
    return ROW_TYPE_PREFIX + table.lower()


def row_server_type(prefix: Sequence[str], table: str) -> tuple[str, ...]:
    """The type those events have on the event server behind a target with ``prefix``."""
    return (*prefix, row_event_type(table))


def _partition(table: str, key: Any) -> str:
    return f"{row_event_type(table)}:{json.dumps(key, sort_keys=True, default=str)}"


def emit_row(tx: Emitter, table: str, key: Any, row: Mapping[str, Any]) -> str:
    """Emit that ``table``'s row ``key`` is now ``row`` (inserted or updated); the event id."""
    return tx.emit(
        row_event_type(table), {"key": key, "row": dict(row)}, partition_key=_partition(table, key)
    )


def emit_deleted(tx: Emitter, table: str, key: Any) -> str:
    """Emit that ``table``'s row ``key`` was deleted; the event id."""
    return tx.emit(
        row_event_type(table), {"key": key, "deleted": True}, partition_key=_partition(table, key)
    )


@dataclass(frozen=True)
class RowChange:
    """One row's new value (``row``), or its deletion (``row`` None), by ``key`` (a tuple of
    the key columns' values)."""

    key: tuple[Any, ...]
    row: dict[str, Any] | None


def parse_row_change(payload: Any, key_columns: Sequence[str]) -> RowChange:
    """A row-change event's decoded JSON payload (or its CloudEvents envelope), checked: the
    key must give one value per key column, and a row that holds a key column must agree."""
    if isinstance(payload, dict) and "specversion" in payload and "data" in payload:
        payload = payload["data"]
    if not isinstance(payload, dict) or "key" not in payload:
        raise IntermediaryError("row change: expected an object with a key")
    raw = payload["key"]
    key = tuple(raw) if isinstance(raw, list) else (raw,)
    if len(key) != len(key_columns) or any(v is None or isinstance(v, (dict, list)) for v in key):
        raise IntermediaryError(
            f"row change: the key {raw!r} does not give one plain value per key column "
            f"{list(key_columns)}"
        )
    if payload.get("deleted") is True and "row" not in payload:
        return RowChange(key, None)
    row = payload.get("row")
    if not isinstance(row, dict) or "deleted" in payload:
        raise IntermediaryError("row change: expected either a row object or deleted: true")
    row = {str(c).lower(): v for c, v in row.items()}
    for column, value in zip(key_columns, key, strict=True):
        if row.setdefault(column, value) != value:
            raise IntermediaryError(
                f"row change: the row's {column} is {row[column]!r}, its key says {value!r}"
            )
    return RowChange(key, row)
