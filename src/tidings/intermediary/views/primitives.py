"""Primitive queries over one table each, and whether upstream ones cover a new one.

Coverage (claim 3, [104]-[105]) must never say "covered" wrongly: a wrong "yes" means a
subscriber silently misses rows. So :func:`covers` proves or says no. A filter is put in
disjunctive normal form (capped; beyond the cap it is one opaque atom); an atom is a range or
a value set on a column declared numeric, or any other condition compared by its normalized
text. A new filter is covered iff each of its clauses implies some clause of an upstream
filter whose primitive has all its columns. Ranges are reasoned about only on numeric columns
with numeric literals: there SQLite's order of values (NULL, numbers, text, blobs) agrees with
the literals' order, whereas a TEXT column compares numbers as text ('10' < '9').
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

#: Past this many clauses a filter's normal form is not expanded: it becomes one opaque atom.
MAX_CLAUSES = 32


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


_FLIP: dict[type[exp.Expression], type[exp.Expression]] = {
    exp.GT: exp.LT,
    exp.GTE: exp.LTE,
    exp.LT: exp.GT,
    exp.LTE: exp.GTE,
    exp.EQ: exp.EQ,
}


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
    form = _dnf(cast(exp.Expression, tree))
    if form is None:
        return ((("opaque", tree.sql(dialect="sqlite", comments=False)),),)
    return tuple(tuple(_atom(a, numeric) for a in clause) for clause in form)


def _intersect(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
    lo, lc = max((a[0], not a[1]), (b[0], not b[1]))
    hi, hc = min((a[2], a[3]), (b[2], b[3]))
    return (lo, not lc, hi, hc)


def _inside(value: float, iv: tuple[Any, ...]) -> bool:
    lo, lc, hi, hc = iv
    return bool((lo < value or (lc and lo == value)) and (value < hi or (hc and value == hi)))


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
            return bool(summary.sets[col] <= atom[2])
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
        forms.append((_clauses(primitive.filter, numeric), _clauses(u.filter, numeric)))
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
            for f in sorted({p.filter for p in group if p.filter is not None}):
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
