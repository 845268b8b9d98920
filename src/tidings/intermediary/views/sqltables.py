"""The tables the intermediary holds for SQL views, and the engine that runs views on them.

The engine is an in-memory SQLite database per :class:`TableState`, each table reloaded only
when it changed since the last evaluation: SQLite is the default dialect, so a view means
exactly what it means on the service's database; it runs in C; a progress handler bounds each
evaluation's steps and time; and an authorizer lets the evaluation read only the view's tables
through allowed functions (defence behind the validation in :mod:`.sqlviews`).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tidings.errors import IntermediaryError
from tidings.intermediary.views.sqlviews import Catalog, SqlView

#: Progress-handler granularity (SQLite virtual machine steps per call).
_STEP = 1_000
#: SQLite functions an evaluation may call: those the allowed sqlglot nodes are written as.
SQLITE_FUNCTIONS = frozenset(
    (  # noqa: SIM905
        "abs avg coalesce count group_concat hex ifnull iif instr length like glob lower "
        "ltrim max min nullif replace round rtrim substr substring sum total trim typeof "
        "upper"
    ).split()
)
_AFFINITY = {"integer": "INTEGER", "real": "REAL", "numeric": "NUMERIC", "text": "TEXT",
             "blob": "BLOB"}  # fmt: skip


def _authorizer(tables: frozenset[str]) -> Any:
    """Allow reading the view's tables and calling allowed functions; deny all else."""

    def authorize(action: int, arg1: str | None, arg2: str | None, *_: Any) -> int:
        if action == sqlite3.SQLITE_SELECT:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_READ and (arg1 or "").lower() in tables:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in SQLITE_FUNCTIONS:
            return sqlite3.SQLITE_OK
        return sqlite3.SQLITE_DENY

    return authorize


def _size(value: object) -> int:
    """What a result value counts against ``max_result_bytes``."""
    return len(value) if isinstance(value, (str, bytes)) else 8


def _sqlite_values(table: str, column: str, array: pa.ChunkedArray) -> list[Any]:
    kind = array.type
    if (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
            or pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)
            or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):  # fmt: skip
        values: list[Any] = array.to_pylist()
        return values
    if pa.types.is_temporal(kind):
        return [None if v is None else v.isoformat() for v in array.to_pylist()]
    if pa.types.is_decimal(kind):
        return [None if v is None else str(v) for v in array.to_pylist()]
    raise IntermediaryError(f"column {table}.{column} has type {kind}, which SQL views cannot read")


def _affinity(kind: pa.DataType) -> str:
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return "INTEGER"
    if pa.types.is_floating(kind):
        return "REAL"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "TEXT"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return "BLOB"
    return ""


_PLAIN = (pa.types.is_integer, pa.types.is_floating, pa.types.is_string, pa.types.is_binary,
          pa.types.is_large_string, pa.types.is_large_binary, pa.types.is_boolean)  # fmt: skip


def _result_array(values: Sequence[Any], kind: pa.DataType | None) -> pa.Array:
    """A result column typed as the state column it copies when it can be, else inferred."""
    if kind is not None and any(test(kind) for test in _PLAIN):
        if pa.types.is_boolean(kind):
            values = [None if v is None else bool(v) for v in values]
        try:
            return pa.array(values, type=kind)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
    try:
        return pa.array(list(values))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array([None if v is None else str(v) for v in values], type=pa.string())


class TableState:
    """The rows of domain tables the intermediary holds for SQL views, one Arrow table per
    domain table, kept up to date by key from upstream rows.

    With a catalog, only its tables are accepted and only its columns kept: the state never
    holds what no view may read. Not a double buffer by itself: the epoch logic of
    :mod:`.state` decides when updates are applied; evaluations and updates of one instance
    are serialized by a lock.
    """

    def __init__(self, catalog: Catalog | None = None) -> None:
        self.catalog = catalog
        self._tables: dict[str, pa.Table] = {}
        self._keys: dict[str, tuple[str, ...]] = {}
        self._versions: dict[str, int] = {}
        self._loaded: dict[str, int] = {}
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None

    def table(self, name: str) -> pa.Table | None:
        """The rows held for a table (None before any arrived)."""
        return self._tables.get(name.lower())

    def _name(self, table: str) -> str:
        if not isinstance(table, str) or not table:
            raise IntermediaryError(f"table name {table!r} is not a name")
        name = table.lower()
        if self.catalog is not None and name not in self.catalog.tables:
            raise IntermediaryError(f"table {name!r} is not in the SQL catalog")
        return name

    def _key(self, name: str, key: str | Sequence[str]) -> tuple[str, ...]:
        cols = (key,) if isinstance(key, str) else tuple(key)
        if not cols or not all(isinstance(c, str) and c for c in cols):
            raise IntermediaryError(f"the key of {name} must name one or more columns, got {key!r}")
        cols = tuple(c.lower() for c in cols)
        if self._keys.setdefault(name, cols) != cols:
            raise IntermediaryError(
                f"the key of {name} is {list(self._keys[name])}, not {list(cols)}"
            )
        return cols

    def upsert(
        self, table: str, rows: pa.Table | Iterable[Mapping[str, Any]], key: str | Sequence[str]
    ) -> None:
        """Insert rows, replacing held rows with the same key (the last of equal keys wins);
        a row replaces the whole held row, columns it lacks become NULL."""
        name = self._name(table)
        with self._lock:
            cols = self._key(name, key)
            try:
                incoming = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as error:
                raise IntermediaryError(f"rows for {name} are not a table: {error}") from None
            lowered = [c.lower() for c in incoming.column_names]
            if len(set(lowered)) != len(lowered):
                raise IntermediaryError(f"rows for {name} name a column twice: {lowered}")
            incoming = incoming.rename_columns(lowered)
            if self.catalog is not None:
                allowed = self.catalog.tables[name]
                incoming = incoming.select([c for c in lowered if c in allowed or c in cols])
            if incoming.num_rows == 0:
                if name not in self._tables and incoming.num_columns:
                    self._tables[name] = incoming  # nothing yet, but the columns are known
                    self._versions[name] = self._versions.get(name, 0) + 1
                return
            for c in cols:
                if c not in incoming.column_names or incoming[c].null_count:
                    raise IntermediaryError(f"every row for {name} needs its key column {c}")
            keys = self._key_values(incoming, cols)
            last = {k: i for i, k in enumerate(keys)}
            if len(last) != len(keys):
                incoming = incoming.take(sorted(last.values()))
            held = self._without(name, cols, incoming)
            try:
                merged = (
                    pa.concat_tables([held, incoming], promote_options="permissive")
                    if held is not None
                    else incoming
                )
            except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
                raise IntermediaryError(
                    f"rows for {name} do not fit the held ones: {error}"
                ) from None
            self._tables[name] = merged.combine_chunks()
            self._versions[name] = self._versions.get(name, 0) + 1

    def delete(self, table: str, keys: Iterable[Any]) -> None:
        """Remove the rows with these keys (values, or tuples for a composite key)."""
        name = self._name(table)
        with self._lock:
            held = self._tables.get(name)
            if held is None:
                return
            cols = self._keys[name]
            wanted = [k if isinstance(k, tuple) else (k,) for k in keys]
            gone = pa.table({c: [k[i] for k in wanted] for i, c in enumerate(cols)})
            self._tables[name] = self._without(name, cols, gone) or held.slice(0, 0)
            self._versions[name] = self._versions.get(name, 0) + 1

    def drop(self, table: str) -> None:
        """Forget a table's rows and key (no view needs it any more)."""
        name = self._name(table)
        with self._lock:
            if self._tables.pop(name, None) is not None:
                self._versions[name] = self._versions.get(name, 0) + 1
            self._keys.pop(name, None)

    def adopt(self, source: TableState) -> frozenset[str]:
        """Hold exactly ``source``'s tables from now on: the epoch swap of a double buffer
        whose inert side is ``source`` (Arrow tables are immutable, so this shares them and
        copies nothing). It happens under this state's lock, so an evaluation sees the
        tables wholly before or wholly after. Returns the names of the tables that changed."""
        with source._lock, self._lock:
            names = set(source._tables) | set(self._tables)
            changed = frozenset(
                n for n in names if source._tables.get(n) is not self._tables.get(n)
            )
            self._tables = dict(source._tables)
            self._keys = dict(source._keys)
            for name in changed:
                self._versions[name] = self._versions.get(name, 0) + 1
        return changed

    @staticmethod
    def _key_values(rows: pa.Table, cols: tuple[str, ...]) -> list[tuple[Any, ...]]:
        return list(zip(*(rows[c].to_pylist() for c in cols), strict=True))

    def _without(self, name: str, cols: tuple[str, ...], rows: pa.Table) -> pa.Table | None:
        """The held rows of ``name`` whose key is not among ``rows``' keys."""
        held = self._tables.get(name)
        if held is None:
            return None
        if len(cols) == 1:
            try:
                mask = pc.is_in(held[cols[0]], value_set=rows[cols[0]].combine_chunks())
                return held.filter(pc.invert(mask))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                pass
        gone = set(self._key_values(rows, cols))
        keep = [k not in gone for k in self._key_values(held, cols)]
        return held.filter(pa.array(keep, type=pa.bool_()))

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = sqlite3.connect(":memory:", check_same_thread=False)
        return self._conn

    def _load(self, conn: sqlite3.Connection, name: str, needed: frozenset[str]) -> None:
        """Make the SQLite copy of ``name`` current: rebuilt only when the table changed."""
        version = self._versions.get(name, 0)
        if self._loaded.get(name) == version:
            return
        held = self._tables.get(name)
        kinds = self.catalog.tables[name] if self.catalog is not None else {}
        # Nothing held yet: the columns the view reads, else (``count(*)``) the catalog's, or
        # one placeholder, since SQLite has no table without columns.
        columns = list(held.column_names) if held is not None else sorted(needed) or list(kinds)
        columns = columns or ["_"]
        missing = sorted(needed - set(columns))
        if missing:
            raise IntermediaryError(f"the state of {name} holds no column {', '.join(missing)}")
        decls = []
        for c in columns:
            kind = kinds.get(c)
            affinity = (
                _AFFINITY[kind] if kind else (_affinity(held[c].type) if held is not None else "")
            )
            decls.append(f'"{c}" {affinity}'.rstrip())
        conn.execute(f'DROP TABLE IF EXISTS "{name}"')
        conn.execute(f'CREATE TABLE "{name}" ({", ".join(decls)})')
        if held is not None and held.num_rows:
            values = [_sqlite_values(name, c, held[c]) for c in columns]
            marks = ", ".join("?" for _ in columns)
            conn.executemany(f'INSERT INTO "{name}" VALUES ({marks})', zip(*values, strict=True))
        conn.commit()
        self._loaded[name] = version

    def evaluate(self, view: SqlView) -> pa.Table:
        """Run the view's normalized SQL on the held rows, bounded by its limits."""
        with self._lock:
            conn = self._connection()
            for table, read in view.tables.items():
                self._load(conn, table, read)
            limits = view.limits
            deadline = time.monotonic() + limits.timeout_s
            budget = [limits.max_steps // _STEP + 1]
            reason: list[str] = []

            def progress() -> int:
                budget[0] -= 1
                if budget[0] < 0:
                    reason.append(f"more than {limits.max_steps} steps")
                elif time.monotonic() > deadline:
                    reason.append(f"more than {limits.timeout_s} s")
                return 1 if reason else 0

            too_large = (
                f"the view was stopped: its result is larger than {limits.max_result_bytes} bytes"
            )
            conn.set_progress_handler(progress, _STEP)
            conn.set_authorizer(_authorizer(frozenset(view.tables)))
            length = conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_result_bytes)
            try:
                cursor = conn.execute(view.sql)
                rows: list[tuple[Any, ...]] = []
                size = 0
                while batch := cursor.fetchmany(1000):
                    size += sum(_size(value) for row in batch for value in row)
                    if size > limits.max_result_bytes:
                        raise IntermediaryError(too_large)
                    rows.extend(batch)
                names = [d[0] for d in cursor.description]
            except sqlite3.Error as error:
                if reason:
                    raise IntermediaryError(f"the view was stopped: it took {reason[0]}") from None
                if getattr(error, "sqlite_errorname", "") == "SQLITE_TOOBIG":
                    raise IntermediaryError(too_large) from None
                raise IntermediaryError(f"the view failed: {error}") from None
            finally:
                conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, length)
                conn.set_authorizer(None)
                conn.set_progress_handler(None, 0)
            types: list[pa.DataType | None] = []
            for source in view.output_columns:
                held = self._tables.get(source[0]) if source is not None else None
                if source is None or held is None or source[1] not in held.column_names:
                    types.append(None)
                else:
                    types.append(held[source[1]].type)
        columns: list[Sequence[Any]] = (
            list(zip(*rows, strict=True)) if rows else [[] for _ in names]
        )
        arrays = [
            _result_array(v, types[i] if i < len(types) else None) for i, v in enumerate(columns)
        ]
        return pa.Table.from_arrays(arrays, names=names)

    def close(self) -> None:
        """Release the SQLite copy (the Arrow tables stay)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                self._loaded.clear()
