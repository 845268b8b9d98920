"""Primitive queries over one table each, whether upstream ones cover a new one, and the
tables the intermediary holds for SQL views and runs them on.

Coverage (claim 3, [104]-[105]) must never say "covered" wrongly: a wrong "yes" means a
subscriber silently misses rows. So :func:`covers` proves or says no. A filter is put in
disjunctive normal form (capped; beyond the cap it is one opaque atom); an atom is a range or
a value set on a column declared numeric, or any other condition compared by its normalized
text. A new filter is covered iff each of its clauses implies some clause of an upstream
filter whose primitive has all its columns. Ranges are reasoned about only on numeric columns
with numeric literals: there SQLite's order of values (NULL, numbers, text, blobs) agrees with
the literals' order, whereas a TEXT column compares numbers as text ('10' < '9').

The engine is an in-memory SQLite database per :class:`TableState`, each table reloaded only
when it changed since the last evaluation: SQLite is the default dialect, so a view means
exactly what it means on the service's database; it runs in C; a progress handler bounds each
evaluation's steps and time; and an authorizer lets the evaluation read only the view's tables
through allowed functions (defence behind the validation in :mod:`.sqlviews`).
"""

from __future__ import annotations

import functools
import math
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from tidings.errors import IntermediaryError

if TYPE_CHECKING:
    from tidings.intermediary.sqlviews import Catalog, SqlView

#: Past this many clauses a filter's normal form is not expanded: it becomes one opaque atom.
MAX_CLAUSES = 32
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


@dataclass(frozen=True)
class Primitive:
    """What the intermediary subscribes upstream for: the rows of ``table`` matching
    ``filter`` (SQLite SQL over that table alone, columns qualified by the table's name; None:
    every row), with ``columns``. ``numeric`` names the table's columns declared numeric,
    where :func:`covers` may reason about ranges; it is not part of the primitive's identity.
    """

    table: str
    columns: frozenset[str]
    filter: str | None = None
    numeric: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def sql(self) -> str:
        """The primitive as a query the upstream can run."""
        cols = ", ".join(f'"{c}"' for c in sorted(self.columns))
        where = f" WHERE {self.filter}" if self.filter is not None else ""
        return f'SELECT {cols} FROM "{self.table}"{where}'


# An atom: ("range", column, lo, lo_closed, hi, hi_closed) | ("set", column, values)
# | ("opaque", text). A clause is a tuple of atoms (their AND); a filter, a tuple of clauses.
Atom = tuple[Any, ...]
_FULL = (-math.inf, False, math.inf, False)


def _number(node: exp.Expression) -> float | int | None:
    negative = isinstance(node, exp.Neg)
    if negative:
        node = node.this
    if not isinstance(node, exp.Literal) or node.is_string:
        return None
    try:
        value: float | int = int(node.this)
    except ValueError:
        try:
            value = float(node.this)
        except ValueError:
            return None
    if not math.isfinite(value):
        return None
    return -value if negative else value


def _column(node: exp.Expression, numeric: frozenset[str]) -> str | None:
    if isinstance(node, exp.Column) and node.name.lower() in numeric:
        return node.name.lower()
    return None


_FLIP = {exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.EQ: exp.EQ}


def _atom(node: exp.Expression, numeric: frozenset[str]) -> Atom:
    if type(node) in _FLIP:
        kind, col, value = type(node), _column(node.this, numeric), _number(node.expression)
        if col is None or value is None:
            kind = _FLIP[type(node)]
            col, value = _column(node.expression, numeric), _number(node.this)
        if col is not None and value is not None:
            if kind is exp.EQ:
                return ("set", col, frozenset([value]))
            if kind in (exp.GT, exp.GTE):
                return ("range", col, value, kind is exp.GTE, math.inf, False)
            return ("range", col, -math.inf, False, value, kind is exp.LTE)
    if isinstance(node, exp.Between) and not node.args.get("symmetric"):
        col, low, high = (
            _column(node.this, numeric),
            _number(node.args["low"]),
            _number(node.args["high"]),
        )
        if col is not None and low is not None and high is not None:
            return ("range", col, low, True, high, True)
    if isinstance(node, exp.In) and not (node.args.get("query") or node.args.get("unnest")):
        col = _column(node.this, numeric)
        values = [_number(v) for v in node.expressions]
        if col is not None and values and None not in values:
            return ("set", col, frozenset(values))
    return ("opaque", node.sql(dialect="sqlite", comments=False))


def _dnf(node: exp.Expression) -> list[list[exp.Expression]] | None:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Or):
        left, right = _dnf(node.this), _dnf(node.expression)
        if left is None or right is None or len(left) + len(right) > MAX_CLAUSES:
            return None
        return left + right
    if isinstance(node, exp.And):
        left, right = _dnf(node.this), _dnf(node.expression)
        if left is None or right is None or len(left) * len(right) > MAX_CLAUSES:
            return None
        return [a + b for a in left for b in right]
    return [[node]]


@functools.lru_cache(maxsize=4096)
def _clauses(text: str, numeric: frozenset[str]) -> tuple[tuple[Atom, ...], ...]:
    """A filter's normal form; one opaque atom when it does not parse or is too large."""
    try:
        tree = sqlglot.parse_one(text, read="sqlite")
    except (SqlglotError, RecursionError):
        return ((("opaque", text),),)
    form = _dnf(tree)
    if form is None:
        return ((("opaque", tree.sql(dialect="sqlite", comments=False)),),)
    return tuple(tuple(_atom(a, numeric) for a in clause) for clause in form)


def _intersect(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
    lo, lc = max((a[0], not a[1]), (b[0], not b[1]))
    hi, hc = min((a[2], a[3]), (b[2], b[3]))
    return (lo, not lc, hi, hc)


def _inside(value: float, iv: tuple[Any, ...]) -> bool:
    lo, lc, hi, hc = iv
    return (lo < value or (lc and lo == value)) and (value < hi or (hc and value == hi))


def _within(inner: tuple[Any, ...], outer: tuple[Any, ...]) -> bool:
    low_ok = outer[0] < inner[0] or (outer[0] == inner[0] and (outer[1] or not inner[1]))
    high_ok = inner[2] < outer[2] or (inner[2] == outer[2] and (outer[3] or not inner[3]))
    return low_ok and high_ok


@dataclass
class _Summary:
    """A clause's constraints combined: it matches nothing when ``empty``."""

    empty: bool
    intervals: dict[str, tuple[Any, ...]]
    sets: dict[str, frozenset[Any]]
    opaque: set[str]


def _summary(clause: tuple[Atom, ...]) -> _Summary:
    intervals: dict[str, tuple[Any, ...]] = {}
    sets: dict[str, frozenset[Any]] = {}
    opaque: set[str] = set()
    for atom in clause:
        if atom[0] == "opaque":
            opaque.add(atom[1])
        elif atom[0] == "range":
            intervals[atom[1]] = _intersect(intervals.get(atom[1], _FULL), atom[2:])
        else:
            sets[atom[1]] = sets[atom[1]] & atom[2] if atom[1] in sets else atom[2]
    empty = any(iv[0] > iv[2] or (iv[0] == iv[2] and not (iv[1] and iv[3]))
                for iv in intervals.values())  # fmt: skip
    for col, values in sets.items():
        sets[col] = frozenset(v for v in values if _inside(v, intervals.get(col, _FULL)))
        empty = empty or not sets[col]
    return _Summary(empty, intervals, sets, opaque)


def _implies(summary: _Summary, atom: Atom) -> bool:
    if summary.empty:
        return True
    if atom[0] == "opaque":
        return atom[1] in summary.opaque
    col = atom[1]
    if col in summary.sets:
        if atom[0] == "set":
            return summary.sets[col] <= atom[2]
        return all(_inside(v, atom[2:]) for v in summary.sets[col])
    iv = summary.intervals.get(col)
    if iv is None:
        return False
    if atom[0] == "range":
        return _within(iv, atom[2:])
    return iv[0] == iv[2] and iv[1] and iv[3] and iv[0] in atom[2]


def covers(upstream: Iterable[Primitive], primitive: Primitive) -> bool:
    """Whether the upstream primitives certainly deliver every row and column ``primitive``
    asks for; conservative (False when it cannot prove it)."""
    candidates = [
        u for u in upstream if u.table == primitive.table and u.columns >= primitive.columns
    ]
    if any(u.filter is None for u in candidates):
        return True
    if not candidates or primitive.filter is None:
        return False
    forms = []
    for u in candidates:
        numeric = primitive.numeric & u.numeric
        forms.append((_clauses(primitive.filter, numeric), _clauses(u.filter, numeric)))  # type: ignore[arg-type]
    for index in range(len(forms[0][0])):
        if not any(
            all(_implies(_summary(new[index]), atom) for atom in up_clause)
            for new, up in forms
            for up_clause in up
        ):
            return False
    return True


def merge(primitives: Iterable[Primitive], max_disjuncts: int = 8) -> list[Primitive]:
    """A small upstream set covering all of ``primitives``: one primitive per table, with the
    union of the columns and the OR of the filters that no other one implies; past
    ``max_disjuncts`` filters (or if the OR cannot be proved to cover each input) the filter
    is dropped and the whole table is asked for."""
    groups: dict[str, list[Primitive]] = {}
    for p in primitives:
        groups.setdefault(p.table, []).append(p)
    merged = []
    for table in sorted(groups):
        group = groups[table]
        columns = frozenset().union(*(p.columns for p in group))
        numeric = frozenset.intersection(*(p.numeric for p in group))
        text: str | None = None
        if all(p.filter is not None for p in group):
            kept: list[str] = []
            for f in sorted({p.filter for p in group}):  # type: ignore[type-var]
                mine = Primitive(table, columns, f, numeric)
                if any(covers([Primitive(table, columns, k, numeric)], mine) for k in kept):
                    continue
                kept = [
                    k for k in kept if not covers([mine], Primitive(table, columns, k, numeric))
                ]
                kept.append(f)
            if len(kept) <= max_disjuncts:
                text = kept[0] if len(kept) == 1 else " OR ".join(f"({k})" for k in kept)
        result = Primitive(table, columns, text, numeric)
        if not all(covers([result], p) for p in group):
            result = Primitive(table, columns, None, numeric)
        merged.append(result)
    return merged


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


def _sqlite_values(table: str, column: str, array: pa.ChunkedArray) -> list[Any]:
    kind = array.type
    if (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
            or pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)
            or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):  # fmt: skip
        return array.to_pylist()
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
        columns = list(held.column_names) if held is not None else sorted(needed)
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
            for table, columns in view.tables.items():
                self._load(conn, table, columns)
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

            conn.set_progress_handler(progress, _STEP)
            conn.set_authorizer(_authorizer(frozenset(view.tables)))
            try:
                cursor = conn.execute(view.sql)
                rows = cursor.fetchall()
                names = [d[0] for d in cursor.description]
            except sqlite3.Error as error:
                if reason:
                    raise IntermediaryError(f"the view was stopped: it took {reason[0]}") from None
                raise IntermediaryError(f"the view failed: {error}") from None
            finally:
                conn.set_authorizer(None)
                conn.set_progress_handler(None, 0)
            types = []
            for source in view.output_columns:
                held = self._tables.get(source[0]) if source else None
                types.append(
                    held[source[1]].type
                    if held is not None and source[1] in held.column_names
                    else None
                )  # type: ignore[index]
        columns = list(zip(*rows, strict=True)) if rows else [[] for _ in names]
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
