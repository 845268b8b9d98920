"""SQL views: a subscriber's read-only ``SELECT`` over domain tables, checked, decomposed into
primitive queries (one per table, claim 3) and evaluated on the rows the intermediary holds.

A view is SQL text from an untrusted subscriber, so nothing of it is trusted: sqlglot parses
it (one statement, a plain ``SELECT``), every node must be of an allowed kind (no writes, no
``PRAGMA``/``ATTACH``, only side-effect-free functions), every table and column must be in the
:class:`Catalog` the configuration gives, ``*`` expands to the allowed columns only, and the
query is bounded (text length, tables, expression depth and size, a ``LIMIT`` added or capped).
What is kept and run is the normalized query sqlglot writes back (SQLite dialect, every column
qualified, comments gone), never the subscriber's text.

The decomposition is what the intermediary subscribes upstream for: per table, the columns the
view reads and a row filter made of the conjuncts that mention that table alone and may narrow
it (outer joins decide which: a table on the null-supplying side of an outer join is never
narrowed, since dropping its rows would turn matches into NULL rows). Evaluating the view on
any superset of the primitives' rows gives exactly its result on the whole tables, because
every narrowing conjunct stays in the view. Coverage of primitives
(:func:`.primitives.covers`) is conservative: it says ``True`` only when it can prove it.
A view is run by the tables that hold the rows (:meth:`.sqltables.TableState.evaluate`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from tidings.errors import IntermediaryError
from tidings.intermediary.views.primitives import Primitive

#: Column kinds a catalog may declare. Only for numeric kinds is range reasoning (``x > 7``
#: implies ``x > 5``) sound: a TEXT column compares a number as text ('10' < '9').
COLUMN_KINDS = frozenset({"integer", "real", "numeric", "text", "blob"})
NUMERIC_KINDS = frozenset({"integer", "real", "numeric"})
DIALECTS = frozenset({"sqlite", "postgres"})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: Node kinds a view may contain. Anything else (writes, DDL, subqueries, window functions,
#: parameters, unknown functions) is refused by name.
_ALLOWED = tuple(
    getattr(exp, name)
    for name in (  # noqa: SIM905
        "Select From Join Table TableAlias Alias Column Identifier Star Where Limit Offset "
        "Order Ordered Group Having Distinct Paren Literal Boolean Null And Or Not EQ NEQ GT "
        "GTE LT LTE Is In Between Like ILike Glob Add Sub Mul Div Mod Neg DPipe Case If Cast "
        "DataType Coalesce Nullif Count Sum Avg Min Max Abs Lower Upper Length Round "
        "Substring Trim Replace StrPosition Greatest Least GroupConcat Typeof"
    ).split()
)
_SET_OPERATIONS = (exp.Union, exp.Intersect, exp.Except)


@dataclass(frozen=True)
class Catalog:
    """What may be subscribed: table -> allowed column -> kind (or None when unknown).

    Names are case-insensitive, as in SQL, and kept lowercase. A column not listed is not
    visible to any view, even through ``*``.
    """

    tables: Mapping[str, Mapping[str, str | None]]
    #: table -> its key column(s), for tables fed by row-change events (:mod:`.rows`).
    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_mapping(
        cls,
        spec: Mapping[str, Iterable[str] | Mapping[str, str | None]],
        keys: Mapping[str, str | Sequence[str]] | None = None,
    ) -> Catalog:
        """Build from configuration: ``{"users": ["id", "name"]}`` or with kinds
        ``{"users": {"id": "integer", "name": "text"}}``, and optionally each table's key
        column(s), ``{"users": "id"}``; bad names, kinds or keys are refused."""
        if not isinstance(spec, Mapping) or not spec:
            raise IntermediaryError("the SQL catalog must map at least one table to its columns")
        tables: dict[str, dict[str, str | None]] = {}
        for table, columns in spec.items():
            name = _catalog_name(table, "table")
            if name in tables:
                raise IntermediaryError(f"table {table!r} is listed twice in the SQL catalog")
            pairs = (
                columns.items() if isinstance(columns, Mapping) else ((c, None) for c in columns)
            )
            cols: dict[str, str | None] = {}
            for column, kind in pairs:
                cname = _catalog_name(column, f"column of {name}")
                if cname in cols:
                    raise IntermediaryError(f"column {name}.{cname} is listed twice")
                if kind is not None and str(kind).lower() not in COLUMN_KINDS:
                    raise IntermediaryError(
                        f"column {name}.{cname} has kind {kind!r}; expected one of "
                        f"{sorted(COLUMN_KINDS)} or none"
                    )
                cols[cname] = None if kind is None else str(kind).lower()
            if not cols:
                raise IntermediaryError(f"table {name!r} in the SQL catalog allows no column")
            tables[name] = cols
        declared: dict[str, tuple[str, ...]] = {}
        for table, key in (keys or {}).items():
            name = _catalog_name(table, "table")
            columns = (key,) if isinstance(key, str) else tuple(key)
            if name not in tables:
                raise IntermediaryError(f"a key is declared for {name!r}, which is not a table")
            if not columns or any(_catalog_name(c, "key") not in tables[name] for c in columns):
                raise IntermediaryError(f"the key of {name} must name columns of it, got {key!r}")
            declared[name] = tuple(c.lower() for c in columns)
        return cls(tables, declared)

    def key(self, table: str) -> tuple[str, ...]:
        """The key column(s) of a table; refused when none is declared."""
        try:
            return self.keys[table]
        except KeyError:
            raise IntermediaryError(f"table {table!r} has no key column declared") from None

    def columns(self, table: str) -> list[str]:
        """The allowed columns of a table, in catalog order."""
        return list(self.tables[table])

    def numeric(self, table: str) -> frozenset[str]:
        """The columns of a table declared numeric (where range implication is sound)."""
        return frozenset(c for c, k in self.tables[table].items() if k in NUMERIC_KINDS)


def _catalog_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise IntermediaryError(f"{what} name {value!r} in the SQL catalog is not a plain name")
    return value.lower()


@dataclass(frozen=True)
class SqlLimits:
    """The bounds every view is held to; all positive.

    ``max_rows`` is the LIMIT added to a view without one and the highest LIMIT (and OFFSET)
    accepted. ``max_steps`` and ``timeout_s`` bound one evaluation in the engine, and
    ``max_result_bytes`` its memory: no value the engine builds (``replace``,
    ``group_concat``, ``||``) and no result as a whole may be larger (text counted in
    characters, a number as 8 bytes).
    """

    max_sql_chars: int = 10_000
    max_rows: int = 10_000
    max_tables: int = 8
    max_depth: int = 48
    max_nodes: int = 2_000
    max_steps: int = 50_000_000
    timeout_s: float = 5.0
    max_disjuncts: int = 8
    max_result_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_sql_chars", "max_rows", "max_tables", "max_depth", "max_nodes",
                     "max_steps", "max_disjuncts", "max_result_bytes"):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise IntermediaryError(
                    f"SqlLimits.{name} must be a positive integer, got {value!r}"
                )
        if not isinstance(self.timeout_s, int | float) or not 0 < self.timeout_s < float("inf"):
            raise IntermediaryError(f"SqlLimits.timeout_s must be positive, got {self.timeout_s!r}")


@dataclass(frozen=True)
class _Source:
    alias: str
    table: str


class SqlView:
    """A validated view: ``sql`` (normalized, bounded, what is run), ``primitives`` (one per
    table read) and ``tables`` (table -> columns the view reads). Build with :meth:`parse`."""

    def __init__(
        self,
        sql: str,
        primitives: tuple[Primitive, ...],
        output_columns: tuple[tuple[str, str] | None, ...],
        limits: SqlLimits,
    ) -> None:
        self.sql = sql
        self.primitives = primitives
        self.tables = {p.table: p.columns for p in primitives}
        #: Per output column, the (table, column) it copies, or None for a computed value.
        self.output_columns = output_columns
        self.limits = limits

    def __repr__(self) -> str:
        return f"SqlView({self.sql!r})"

    @classmethod
    def parse(
        cls, sql: str, catalog: Catalog, limits: SqlLimits | None = None, dialect: str = "sqlite"
    ) -> SqlView:
        """Check a subscriber's SQL and decompose it; :class:`IntermediaryError` names what
        is refused."""
        limits = limits or SqlLimits()
        select = _parse_one(sql, limits, dialect)
        _check_shape(select, limits)
        _check_nodes(select)
        sources = _sources(select, catalog, limits)
        _expand_stars(select, sources, catalog)
        _resolve_columns(select, sources, catalog)
        _bound_limit(select, limits)
        primitives = _decompose(select, sources, catalog)
        outputs = tuple(_output_column(e, sources) for e in select.expressions)
        return cls(select.sql(dialect="sqlite", comments=False), primitives, outputs, limits)


def _parse_one(sql: str, limits: SqlLimits, dialect: str) -> exp.Select:
    if not isinstance(sql, str) or not sql.strip():
        raise IntermediaryError("the view's SQL is empty")
    if len(sql) > limits.max_sql_chars:
        raise IntermediaryError(
            f"the view's SQL is {len(sql)} characters long; at most {limits.max_sql_chars}"
        )
    if dialect not in DIALECTS:
        raise IntermediaryError(f"SQL dialect {dialect!r} is not supported; use {sorted(DIALECTS)}")
    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except SqlglotError as error:
        raise IntermediaryError(f"the view's SQL does not parse: {error}") from None
    except RecursionError:
        raise IntermediaryError("the view's SQL is nested too deeply") from None
    if len(statements) != 1:
        raise IntermediaryError(f"a view is exactly one statement, got {len(statements)}")
    statement = statements[0]
    if isinstance(statement, _SET_OPERATIONS):
        raise IntermediaryError(
            f"{statement.key.upper()} is not supported: subscribe to each SELECT on its own"
        )
    if not isinstance(statement, exp.Select):
        kind = statement.key.upper()
        if isinstance(statement, exp.Command):
            kind = str(statement.this).upper()
        raise IntermediaryError(f"only SELECT may be subscribed, got {kind}")
    return statement


def _check_shape(select: exp.Select, limits: SqlLimits) -> None:
    """Depth and size first (before anything recurses on the tree), then no nested query."""
    stack: list[tuple[exp.Expr, int]] = [(select, 1)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if depth > limits.max_depth:
            raise IntermediaryError(f"the view's expressions nest deeper than {limits.max_depth}")
        if nodes > limits.max_nodes:
            raise IntermediaryError(f"the view has more than {limits.max_nodes} syntax nodes")
        stack.extend((child, depth + 1) for child in node.iter_expressions())
    if select.args.get("with_") or select.args.get("with"):
        raise IntermediaryError("WITH (common table expressions) is not supported in a view")
    for node in select.walk():
        if node is not select and isinstance(node, exp.Query | exp.Subquery):
            raise IntermediaryError("subqueries are not supported in a view")


def _sources(select: exp.Select, catalog: Catalog, limits: SqlLimits) -> list[_Source]:
    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is None:
        raise IntermediaryError("a view must read FROM at least one table")
    joins = select.args.get("joins") or []
    if 1 + len(joins) > limits.max_tables:
        raise IntermediaryError(
            f"the view reads {1 + len(joins)} tables; at most {limits.max_tables}"
        )
    for join in joins:
        if join.method:
            raise IntermediaryError(f"{join.method.upper()} JOIN is not supported: use JOIN ... ON")
        if join.args.get("using"):
            raise IntermediaryError("JOIN ... USING is not supported: use JOIN ... ON")
        if join.kind and join.kind.upper() not in ("INNER", "OUTER", "CROSS"):
            raise IntermediaryError(f"{join.kind.upper()} JOIN is not supported")
    sources: list[_Source] = []
    for table in [from_.this, *(j.this for j in joins)]:
        if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
            raise IntermediaryError("a view reads only tables (no table functions or subqueries)")
        if table.args.get("db") or table.args.get("catalog"):
            raise IntermediaryError(f"table {table.sql()!r}: qualified table names are not allowed")
        name = table.name.lower()
        if name not in catalog.tables:
            raise IntermediaryError(f"table {name!r} is not subscribable")
        alias = (table.alias or name).lower()
        if any(s.alias == alias for s in sources):
            raise IntermediaryError(f"table alias {alias!r} is used twice in the view")
        sources.append(_Source(alias, name))
        table.set("this", exp.to_identifier(name, quoted=True))
        table.set("alias", exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
    return sources


def _expand_stars(select: exp.Select, sources: list[_Source], catalog: Catalog) -> None:
    """``*`` and ``t.*`` become the allowed columns only, qualified."""
    projections: list[exp.Expression] = []
    for item in select.expressions:
        if isinstance(item, exp.Star):
            chosen = sources
        elif isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
            alias = item.table.lower()
            chosen = [s for s in sources if s.alias == alias]
            if not chosen:
                raise IntermediaryError(f"{item.sql()}: no table or alias {alias!r} in the view")
        else:
            projections.append(item)
            continue
        projections.extend(
            exp.column(c, table=s.alias, quoted=True)
            for s in chosen
            for c in catalog.columns(s.table)
        )
    select.set("expressions", projections)


def _check_nodes(select: exp.Select) -> None:
    for node in select.walk():
        if isinstance(node, exp.Anonymous):
            raise IntermediaryError(f"function {node.name.lower()} is not allowed in a view")
        if not isinstance(node, _ALLOWED):
            if isinstance(node, exp.Func):
                raise IntermediaryError(
                    f"function {node.sql_name().lower()} is not allowed in a view"
                )
            raise IntermediaryError(f"{node.key.upper()} is not allowed in a view")


def _resolve_columns(select: exp.Select, sources: list[_Source], catalog: Catalog) -> None:
    """Qualify every column by its alias, refusing what the catalog does not allow."""
    by_alias = {s.alias: s for s in sources}
    output_names = {e.alias.lower() for e in select.expressions if isinstance(e, exp.Alias)}
    for column in list(select.find_all(exp.Column)):
        if isinstance(column.this, exp.Star):
            raise IntermediaryError(f"{column.sql()} is only allowed as a projection")
        if column.args.get("db") or column.args.get("catalog"):
            raise IntermediaryError(f"column {column.sql()!r}: qualify columns by table only")
        name = column.name.lower()
        qualifier = column.table.lower()
        if qualifier:
            source = by_alias.get(qualifier)
            if source is None:
                raise IntermediaryError(f"column {column.sql()}: no table or alias {qualifier!r}")
            if name not in catalog.tables[source.table]:
                raise IntermediaryError(f"column {source.table}.{name} is not allowed")
        else:
            if name in output_names and column.find_ancestor(exp.Order) is not None:
                column.set("this", exp.to_identifier(column.name, quoted=True))
                continue  # an ORDER BY naming an output column
            found = [s for s in sources if name in catalog.tables[s.table]]
            if not found:
                tables = ", ".join(sorted({s.table for s in sources}))
                raise IntermediaryError(f"column {name} is not allowed (in {tables})")
            if len(found) > 1:
                raise IntermediaryError(
                    f"column {name} is ambiguous: qualify it ({', '.join(s.alias for s in found)})"
                )
            source = found[0]
        column.set("this", exp.to_identifier(name, quoted=True))
        column.set("table", exp.to_identifier(source.alias, quoted=True))
    for alias in select.find_all(exp.Alias):
        alias.set("alias", exp.to_identifier(alias.alias, quoted=True))


def _literal_count(node: exp.Expression | None, clause: str, limits: SqlLimits) -> int | None:
    if node is None:
        return None
    value = node.args.get("expression")
    if not (isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()):
        raise IntermediaryError(f"{clause} must be a non-negative whole number, got {node.sql()}")
    count = int(value.this)
    if count > limits.max_rows:
        raise IntermediaryError(f"{clause} {count} is above the maximum {limits.max_rows}")
    return count


def _bound_limit(select: exp.Select, limits: SqlLimits) -> None:
    """A missing LIMIT becomes ``max_rows``; a larger one (or OFFSET) is refused."""
    if _literal_count(select.args.get("limit"), "LIMIT", limits) is None:
        select.set("limit", exp.Limit(expression=exp.Literal.number(limits.max_rows)))
    _literal_count(select.args.get("offset"), "OFFSET", limits)


def _conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    if node is None:
        return []
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]


def _aliases(node: exp.Expression) -> set[str]:
    return {c.table.lower() for c in node.find_all(exp.Column) if c.table}


def _decompose(
    select: exp.Select, sources: list[_Source], catalog: Catalog
) -> tuple[Primitive, ...]:
    """One primitive per table: the columns read and the conjuncts that may narrow it."""
    by_alias = {s.alias: s for s in sources}
    joins = select.args.get("joins") or []
    aliases = [s.alias for s in sources]
    nullable: dict[str, bool] = dict.fromkeys(aliases, False)
    narrowing: dict[str, list[exp.Expression]] = {a: [] for a in aliases}
    for index, join in enumerate(joins, start=1):
        side = (join.side or "").upper()
        before = dict(nullable)
        for conjunct in _conjuncts(join.args.get("on")):
            used = _aliases(conjunct)
            if len(used) != 1:
                continue  # a join condition or a constant: evaluated here, narrows nothing
            (alias,) = used
            own = alias == aliases[index]
            if (
                (side == "" and not before[alias])
                or (side == "LEFT" and own)
                or (side == "RIGHT" and not own and not before[alias])
            ):
                narrowing[alias].append(conjunct)
        if side == "LEFT":
            nullable[aliases[index]] = True
        elif side in ("RIGHT", "FULL"):
            for alias in aliases[: index + (side == "FULL")]:
                nullable[alias] = True
    where = select.args.get("where")
    for conjunct in _conjuncts(where.this if where is not None else None):
        used = _aliases(conjunct)
        if len(used) == 1 and not nullable[next(iter(used))]:
            narrowing[next(iter(used))].append(conjunct)
    needed: dict[str, set[str]] = {s.table: set() for s in sources}
    for column in select.find_all(exp.Column):
        if column.table:
            needed[by_alias[column.table.lower()].table].add(column.name.lower())
    filters: dict[str, list[str | None]] = {s.table: [] for s in sources}
    for alias in aliases:
        table = by_alias[alias].table
        texts = sorted({_on_table(c, table) for c in narrowing[alias]})
        filters[table].append(
            " AND ".join(f"({t})" if len(texts) > 1 else t for t in texts) or None
        )
    primitives = []
    for table in sorted(needed):
        parts = filters[table]
        present = [t for t in parts if t is not None]
        if len(present) < len(parts):
            text = None
        else:
            distinct = sorted(set(present))
            text = distinct[0] if len(distinct) == 1 else " OR ".join(f"({t})" for t in distinct)
        columns = frozenset(needed[table])
        primitives.append(Primitive(table, columns, text, catalog.numeric(table)))
    return tuple(primitives)


def _on_table(conjunct: exp.Expression, table: str) -> str:
    """A conjunct over one alias, rewritten over the table's own name."""
    copy = conjunct.copy()
    for column in copy.find_all(exp.Column):
        column.set("table", exp.to_identifier(table, quoted=True))
    return copy.sql(dialect="sqlite", comments=False)


def _output_column(item: exp.Expression, sources: list[_Source]) -> tuple[str, str] | None:
    inner = item.this if isinstance(item, exp.Alias) else item
    if isinstance(inner, exp.Column) and inner.table:
        table = next(s.table for s in sources if s.alias == inner.table.lower())
        return (table, inner.name.lower())
    return None
