"""SQL views of the intermediary (issue 12, items 2c and 3; patent [94], [104]-[105],
[158]-[163], claim 3): validation, decomposition into primitives, coverage, evaluation."""

from __future__ import annotations

import sqlite3
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidings import IntermediaryError, TidingsError
from tidings.intermediary.views.primitives import Primitive, covers, merge
from tidings.intermediary.views.sqltables import TableState
from tidings.intermediary.views.sqlviews import Catalog, SqlLimits, SqlView

CATALOG = Catalog.from_mapping(
    {
        "users": {"id": "integer", "name": "text", "age": "integer"},
        "emails": {"id": "integer", "user_id": "integer", "email": "text"},
    }
)
USERS = [
    {"id": 1, "name": "ada", "age": 36, "password": "x"},
    {"id": 2, "name": "bob", "age": 17, "password": "y"},
    {"id": 3, "name": "cy", "age": 52, "password": "z"},
]
EMAILS = [
    {"id": 10, "user_id": 1, "email": "ada@a.org"},
    {"id": 11, "user_id": 1, "email": "ada@b.org"},
    {"id": 12, "user_id": 2, "email": "bob@a.org"},
    {"id": 13, "user_id": 9, "email": "ghost@a.org"},
]


def state_of(users: list[dict[str, Any]], emails: list[dict[str, Any]]) -> TableState:
    state = TableState(CATALOG)
    state.upsert("users", users, key="id")
    state.upsert("emails", emails, key="id")
    return state


def rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(
        zip(*(c.to_pylist() for c in table.columns), strict=True),
        key=lambda r: [(v is not None, v) for v in r],
    )


def by_table(view: SqlView) -> dict[str, Primitive]:
    return {p.table: p for p in view.primitives}


# --- the patent's example, decomposition ------------------------------------------------


def test_patent_example_parses_decomposes_and_evaluates() -> None:
    view = SqlView.parse(
        "SELECT users.name, emails.email FROM users JOIN emails ON users.id = emails.user_id",
        CATALOG,
    )
    prims = by_table(view)
    assert set(prims) == {"users", "emails"}
    assert prims["users"].columns == {"id", "name"} and prims["users"].filter is None
    assert prims["emails"].columns == {"user_id", "email"} and prims["emails"].filter is None
    assert view.sql.endswith("LIMIT 10000")  # bounded although the subscriber gave no LIMIT
    result = state_of(USERS, EMAILS).evaluate(view)
    assert result.column_names == ["name", "email"]
    assert rows(result) == [("ada", "ada@a.org"), ("ada", "ada@b.org"), ("bob", "bob@a.org")]


def test_aliases_star_and_per_table_conjuncts() -> None:
    view = SqlView.parse(
        "SELECT * FROM users AS u JOIN emails e ON u.id = e.user_id AND e.email LIKE '%@a.org'"
        " WHERE u.age > 30 AND u.age + e.id > 0 AND age < 99",
        CATALOG,
    )
    prims = by_table(view)
    assert prims["users"].columns == {"id", "name", "age"}
    assert prims["users"].filter == '("users"."age" < 99) AND ("users"."age" > 30)'
    assert prims["emails"].filter == '"emails"."email" LIKE \'%@a.org\''
    assert prims["emails"].columns == {"id", "user_id", "email"}
    result = state_of(USERS, EMAILS).evaluate(view)
    assert result.column_names == ["id", "name", "age", "id", "user_id", "email"]
    assert rows(result) == [(1, "ada", 36, 10, 1, "ada@a.org")]
    # a primitive is a query the upstream can run
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE users (id INTEGER, name TEXT, age INTEGER)")
    db.executemany("INSERT INTO users VALUES (?, ?, ?)", [(1, "a", 36), (2, "b", 17)])
    assert db.execute(prims["users"].sql).fetchall() == [(36, 1, "a")]


def test_star_never_shows_a_column_the_catalog_hides() -> None:
    catalog = Catalog.from_mapping({"users": ["id", "name"]})
    view = SqlView.parse("SELECT * FROM users", catalog)
    state = TableState(catalog)
    state.upsert("users", USERS, key="id")
    assert state.table("users").column_names == ["id", "name"]  # the password is not even kept
    assert state.evaluate(view).column_names == ["id", "name"]
    with pytest.raises(IntermediaryError, match=r"column users\.password is not allowed"):
        SqlView.parse("SELECT u.password FROM users u", catalog)


def test_outer_joins_narrow_only_what_they_may() -> None:
    view = SqlView.parse(
        "SELECT u.name, e.email FROM users u LEFT JOIN emails e"
        " ON u.id = e.user_id AND e.id > 10 AND u.age > 20 WHERE e.email IS NULL AND u.age < 50",
        CATALOG,
    )
    prims = by_table(view)
    # ON of a LEFT JOIN narrows the joined table, not the preserved one; WHERE narrows the
    # preserved table but never the null-supplying one (its missing rows become NULL rows)
    assert prims["emails"].filter == '"emails"."id" > 10'
    assert prims["users"].filter == '"users"."age" < 50'
    assert rows(state_of(USERS, EMAILS).evaluate(view)) == [("bob", None)]


def test_self_join_gives_one_primitive_with_both_filters() -> None:
    view = SqlView.parse(
        "SELECT a.name, b.name FROM users a JOIN users b ON a.age < b.age"
        " WHERE a.age > 30 AND b.age > 40",
        CATALOG,
    )
    (prim,) = view.primitives
    assert prim.filter == '("users"."age" > 30) OR ("users"."age" > 40)'
    assert rows(state_of(USERS, EMAILS).evaluate(view)) == [("ada", "cy")]


def test_postgres_dialect_and_normalization_is_stable() -> None:
    view = SqlView.parse(
        "SELECT u.name FROM users u WHERE u.name ILIKE 'A%' LIMIT 5", CATALOG, dialect="postgres"
    )
    assert rows(state_of(USERS, EMAILS).evaluate(view)) == [("ada",)]
    again = SqlView.parse(view.sql, CATALOG)
    assert again.sql == view.sql and again.primitives == view.primitives


def test_order_by_output_alias_and_aggregates() -> None:
    view = SqlView.parse(
        "SELECT u.name AS who, COUNT(e.id) AS n FROM users u LEFT JOIN emails e"
        " ON u.id = e.user_id GROUP BY u.name HAVING COUNT(e.id) >= 0 ORDER BY n DESC, who",
        CATALOG,
    )
    result = state_of(USERS, EMAILS).evaluate(view)
    assert result.column_names == ["who", "n"]
    assert result.to_pylist() == [
        {"who": "ada", "n": 2},
        {"who": "bob", "n": 1},
        {"who": "cy", "n": 0},
    ]


def test_every_allowed_function_runs_past_the_authorizer() -> None:
    view = SqlView.parse(
        "SELECT ABS(-u.age), LOWER(u.name), UPPER(u.name), LENGTH(u.name), ROUND(u.age, 1),"
        " COALESCE(u.name, 'x'), IFNULL(u.name, 'x'), NULLIF(u.age, 0), SUBSTR(u.name, 1, 2),"
        " TRIM(u.name), LTRIM(u.name), RTRIM(u.name), REPLACE(u.name, 'a', 'b'),"
        " INSTR(u.name, 'a'), MIN(u.age, 3), MAX(u.age, 3), IIF(u.age > 1, 1, 0), TYPEOF(u.age),"
        " CAST(u.age AS TEXT), u.name || 'x', CASE WHEN u.age > 20 THEN 'old' END,"
        " u.name GLOB 'a*', u.age BETWEEN 1 AND 99, u.age IN (1, 36), u.age % 7, u.age / 2"
        " FROM users u WHERE u.id = 1",
        CATALOG,
    )
    assert state_of(USERS, EMAILS).evaluate(view).num_rows == 1
    agg = SqlView.parse(
        "SELECT COUNT(*), SUM(u.age), AVG(u.age), MIN(u.age), MAX(u.age), GROUP_CONCAT(u.name)"
        " FROM users u",
        CATALOG,
    )
    assert state_of(USERS, EMAILS).evaluate(agg).to_pylist()[0]["COUNT(*)"] == 3


# --- refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("INSERT INTO users (id) VALUES (1)", "only SELECT may be subscribed, got INSERT"),
        ("UPDATE users SET name = 'x'", "only SELECT may be subscribed, got UPDATE"),
        ("DELETE FROM users", "only SELECT may be subscribed, got DELETE"),
        ("DROP TABLE users", "only SELECT may be subscribed, got DROP"),
        ("CREATE TABLE x (a INT)", "only SELECT may be subscribed, got CREATE"),
        ("PRAGMA table_info(users)", "only SELECT may be subscribed, got PRAGMA"),
        ("ATTACH DATABASE '/tmp/x.db' AS x", "only SELECT may be subscribed, got ATTACH"),
        ("SELECT name FROM users; DROP TABLE users", "exactly one statement, got 2"),
        ("SELECT name FROM users /* hide */; DELETE FROM users --", "exactly one statement"),
        ("SELECT * FROM secrets", "table 'secrets' is not subscribable"),
        ("SELECT users.password FROM users", r"column users\.password is not allowed"),
        ("SELECT password FROM users", "column password is not allowed"),
        ("SELECT id FROM users JOIN emails ON users.id = emails.user_id", "ambiguous"),
        ("SELECT x.name FROM users u", "no table or alias 'x'"),
        ("SELECT name FROM main.users", "qualified table names are not allowed"),
        ("SELECT name FROM users u JOIN users u ON 1", "alias 'u' is used twice"),
        ("SELECT load_extension('evil.so')", "function load_extension is not allowed"),
        ("SELECT readfile('/etc/passwd') FROM users", "function readfile is not allowed"),
        ("SELECT RANDOM() FROM users", "function rand is not allowed"),
        ("SELECT name FROM users WHERE id IN (SELECT user_id FROM emails)", "subqueries"),
        ("WITH c AS (SELECT id FROM users) SELECT id FROM c", "WITH"),
        ("SELECT name FROM users UNION SELECT email FROM emails", "UNION is not supported"),
        ("SELECT name FROM users NATURAL JOIN emails", "NATURAL JOIN is not supported"),
        ("SELECT name FROM users JOIN emails USING (id)", "USING is not supported"),
        ("SELECT * FROM json_each('[1]')", "function json_each is not allowed"),
        ("SELECT 1", "must read FROM at least one table"),
        ("SELECT name FROM users WHERE id = ?", "PLACEHOLDER is not allowed"),
        ("SELECT name FROM users LIMIT 100000", "LIMIT 100000 is above the maximum 10000"),
        ("SELECT name FROM users LIMIT -1", "LIMIT must be a non-negative whole number"),
        ("SELECT name FROM users LIMIT 1 OFFSET 99999", "OFFSET 99999 is above"),
        ("SELECT name FROM users WHERE", "does not parse"),
        ("", "empty"),
    ],
)
def test_refusals_name_the_problem(sql: str, message: str) -> None:
    with pytest.raises(IntermediaryError, match=message):
        SqlView.parse(sql, CATALOG)


def test_a_comment_cannot_smuggle_a_statement() -> None:
    view = SqlView.parse("SELECT name FROM users -- ; DROP TABLE users", CATALOG)
    assert "DROP" not in view.sql and "--" not in view.sql and "/*" not in view.sql


def test_bounds_on_size_tables_and_depth() -> None:
    limits = SqlLimits(max_sql_chars=200, max_tables=2, max_depth=20)
    with pytest.raises(IntermediaryError, match="characters long; at most 200"):
        SqlView.parse(
            "SELECT name FROM users WHERE " + " OR ".join(["id = 1"] * 40), CATALOG, limits
        )
    with pytest.raises(IntermediaryError, match="reads 3 tables; at most 2"):
        SqlView.parse("SELECT a.id FROM users a, users b, users c", CATALOG, limits)
    deep = "SELECT name FROM users WHERE " + "(" * 30 + "id = 1" + ")" * 30
    with pytest.raises(IntermediaryError, match="nest deeper than 20"):
        SqlView.parse(deep, CATALOG, limits)
    huge = "SELECT name FROM users WHERE " + "(" * 5000 + "1" + ")" * 5000
    with pytest.raises(IntermediaryError):
        SqlView.parse(huge, CATALOG, SqlLimits(max_sql_chars=20_000))
    assert SqlView.parse("SELECT name FROM users LIMIT 7", CATALOG).sql.endswith("LIMIT 7")


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"users": []},
        {"bad name": ["id"]},
        {"users": {"id": "varchar"}},
        {"users": ["id", "ID"]},
    ],
)
def test_bad_catalogs_are_refused(spec: Any) -> None:
    with pytest.raises(IntermediaryError):
        Catalog.from_mapping(spec)


def test_bad_limits_are_refused() -> None:
    for kwargs in ({"max_rows": 0}, {"max_tables": -1}, {"timeout_s": float("nan")}):
        with pytest.raises(IntermediaryError):
            SqlLimits(**kwargs)
    assert issubclass(IntermediaryError, TidingsError)


# --- evaluation -------------------------------------------------------------------------


def test_a_runaway_view_is_stopped_by_the_step_bound() -> None:
    state = TableState(CATALOG)
    state.upsert("users", [{"id": i, "name": str(i), "age": i} for i in range(300)], key="id")
    view = SqlView.parse(
        "SELECT COUNT(*) FROM users a, users b, users c WHERE a.age + b.age = c.age",
        CATALOG,
        SqlLimits(max_steps=100_000),
    )
    with pytest.raises(IntermediaryError, match="stopped: it took more than 100000 steps"):
        state.evaluate(view)
    small = SqlView.parse("SELECT COUNT(*) AS n FROM users", CATALOG, SqlLimits(max_steps=100_000))
    assert state.evaluate(small).to_pylist() == [{"n": 300}]  # the connection still works


def test_a_view_that_builds_huge_values_or_results_is_stopped_by_the_size_bound() -> None:
    """Memory, not only time: nested replace() multiplies a value's length by ten per level
    and group_concat over a cartesian join grows one value with every row; both, and a
    result of many small rows (10,000 of 120 characters), are refused once over
    ``max_result_bytes``."""
    state = TableState(CATALOG)
    state.upsert("users", [{"id": i, "name": "n" * 10, "age": i} for i in range(300)], key="id")
    limits = SqlLimits(max_result_bytes=1_000_000)
    blowup = "u.name"
    for _ in range(6):  # 10**7 characters
        blowup = f"replace({blowup}, 'n', u.name)"
    for sql in (
        f"SELECT length({blowup}) AS n FROM users u WHERE u.id = 0",
        "SELECT length(group_concat(a.name || b.name)) AS n FROM users a, users b",
        "SELECT " + " || ".join(["a.name"] * 12) + " AS ab FROM users a, users b",
    ):
        with pytest.raises(IntermediaryError, match="larger than 1000000 bytes"):
            state.evaluate(SqlView.parse(sql, CATALOG, limits))
    fine = SqlView.parse("SELECT length(group_concat(name)) AS n FROM users", CATALOG, limits)
    assert state.evaluate(fine).to_pylist() == [{"n": 300 * 11 - 1}]


def test_table_state_upserts_by_key_deletes_and_reloads() -> None:
    state = state_of(USERS, EMAILS)
    view = SqlView.parse("SELECT u.id, u.name FROM users u ORDER BY u.id", CATALOG)
    assert state.evaluate(view).column("name").to_pylist() == ["ada", "bob", "cy"]
    state.upsert("users", [{"id": 2, "name": "bea", "age": 18}, {"id": 4, "name": "dee"}], key="id")
    assert state.evaluate(view).to_pylist() == [
        {"id": 1, "name": "ada"},
        {"id": 2, "name": "bea"},
        {"id": 3, "name": "cy"},
        {"id": 4, "name": "dee"},
    ]
    state.delete("users", [1, 4])
    assert state.evaluate(view).column("id").to_pylist() == [2, 3]
    state.upsert("users", [{"id": 5, "name": "e"}, {"id": 5, "name": "f"}], key="id")
    assert state.table("users").num_rows == 3
    assert state.evaluate(view).column("name").to_pylist()[-1] == "f"  # the last one wins


def test_table_state_refuses_what_it_cannot_hold() -> None:
    state = TableState(CATALOG)
    with pytest.raises(IntermediaryError, match="not in the SQL catalog"):
        state.upsert("secrets", [{"id": 1}], key="id")
    with pytest.raises(IntermediaryError, match="needs its key column id"):
        state.upsert("users", [{"name": "x"}], key="id")
    state.upsert("users", [{"id": 1, "name": "x"}], key="id")
    with pytest.raises(IntermediaryError, match="the key of users is"):
        state.upsert("users", [{"id": 1, "name": "x"}], key="name")
    view = SqlView.parse("SELECT u.age FROM users u", CATALOG)
    with pytest.raises(IntermediaryError, match="holds no column age"):
        state.evaluate(view)


def test_composite_keys_and_empty_state() -> None:
    catalog = Catalog.from_mapping({"pos": {"shard": "integer", "id": "integer", "x": "real"}})
    state = TableState(catalog)
    view = SqlView.parse("SELECT p.shard, p.id, p.x FROM pos p ORDER BY p.shard, p.id", catalog)
    empty = state.evaluate(view)
    assert empty.num_rows == 0 and empty.column_names == ["shard", "id", "x"]
    state.upsert(
        "pos", [{"shard": 1, "id": 1, "x": 0.5}, {"shard": 2, "id": 1, "x": 1.5}], ["shard", "id"]
    )
    state.upsert("pos", [{"shard": 2, "id": 1, "x": 2.5}], ["shard", "id"])
    state.delete("pos", [(1, 1)])
    assert state.evaluate(view).to_pylist() == [{"shard": 2, "id": 1, "x": 2.5}]


# --- coverage ---------------------------------------------------------------------------

NUM = frozenset({"a", "b"})


def prim(filter_: str | None, columns: str = "a b", numeric: frozenset[str] = NUM) -> Primitive:
    return Primitive("t", frozenset(columns.split()), filter_, numeric)


@pytest.mark.parametrize(
    ("upstream", "new", "expected"),
    [
        (None, '"t"."a" > 7', True),
        ('"t"."a" > 5', '"t"."a" > 7', True),
        ('"t"."a" > 7', '"t"."a" > 5', False),
        ('"t"."a" >= 5', '"t"."a" = 5', True),
        ('"t"."a" > 5', '"t"."a" = 5', False),
        ('"t"."a" > 5', '"t"."a" >= 5', False),
        ('"t"."a" <= 5', '"t"."a" < 5', True),
        ('"t"."a" < 5', '"t"."a" <= 5', False),
        ('"t"."a" = 1', '"t"."a" = 1 AND "t"."b" = 2', True),
        ('"t"."a" = 1 AND "t"."b" = 2', '"t"."a" = 1', False),
        ('"t"."a" BETWEEN 0 AND 10', '"t"."a" IN (1, 2, 10)', True),
        ('"t"."a" IN (1, 2)', '"t"."a" >= 1 AND "t"."a" <= 1', True),
        ('"t"."a" IN (1, 2)', '"t"."a" > 0 AND "t"."a" < 3', False),
        ('"t"."a" < 0', '"t"."a" > 3 AND "t"."a" < 2', True),  # the new one matches nothing
        ('"t"."a" > 5 OR "t"."b" < 0', '"t"."b" < -3', True),
        ('"t"."a" > 5', '"t"."a" > 6 OR "t"."a" < 0', False),
        ('"t"."c" LIKE \'x%\'', '"t"."c" LIKE \'x%\' AND "t"."a" = 1', True),
        ('"t"."c" LIKE \'x%\'', '"t"."c" LIKE \'y%\'', False),
        ('5 < "t"."a"', '"t"."a" >= 6', True),
        ('"t"."a" > -2.5', '"t"."a" > -2', True),
        ('"t"."a" > 5', None, False),
    ],
)
def test_covers_by_implication(upstream: str | None, new: str | None, expected: bool) -> None:
    assert covers([prim(upstream)], prim(new)) is expected


def test_covers_needs_the_columns_and_the_table() -> None:
    assert covers([prim(None, "a b c")], prim(None, "a c"))
    assert not covers([prim(None, "a")], prim(None, "a b"))
    assert not covers([Primitive("u", frozenset({"a"}))], prim(None, "a"))
    assert not covers([], prim(None, "a"))


def test_ranges_are_not_reasoned_about_on_text_columns() -> None:
    # on a TEXT column SQLite compares a number as text: '9' > '10', so a > 10 does not imply a > 9
    assert not covers(
        [prim('"t"."a" > 9', numeric=frozenset())], prim('"t"."a" > 10', numeric=frozenset())
    )
    assert covers(
        [prim('"t"."a" > 9', numeric=frozenset())], prim('"t"."a" > 9', numeric=frozenset())
    )


def test_collective_cover_of_a_disjunction() -> None:
    upstream = [prim('"t"."a" < 0'), prim('"t"."a" > 10')]
    assert covers(upstream, prim('"t"."a" < -1 OR "t"."a" > 11'))
    assert not covers(upstream, prim('"t"."a" < -1 OR "t"."a" = 5'))


def test_a_view_is_covered_iff_each_primitive_is() -> None:
    upstream = [
        Primitive(
            "users",
            frozenset({"id", "name", "age"}),
            '"users"."age" > 18',
            CATALOG.numeric("users"),
        ),
        Primitive("emails", frozenset({"user_id", "email"}), None, CATALOG.numeric("emails")),
    ]
    covered = SqlView.parse(
        "SELECT u.name, e.email FROM users u JOIN emails e ON u.id = e.user_id WHERE u.age >= 21",
        CATALOG,
    )
    assert all(covers(upstream, p) for p in covered.primitives)
    partly = SqlView.parse(
        "SELECT u.name, e.id FROM users u JOIN emails e ON u.id = e.user_id WHERE u.age > 18",
        CATALOG,
    )
    assert [covers(upstream, p) for p in partly.primitives] == [False, True]  # emails needs id


def test_merge_keeps_one_primitive_per_table() -> None:
    ps = [prim('"t"."a" > 5', "a"), prim('"t"."a" > 7', "b"), prim('"t"."b" = 1', "a")]
    (merged,) = merge(ps)
    assert merged.columns == {"a", "b"}
    assert merged.filter == '("t"."a" > 5) OR ("t"."b" = 1)'  # a > 7 is implied by a > 5
    assert all(covers([merged], p) for p in ps)
    many = [prim(f'"t"."a" = {i}') for i in range(20)]
    (wide,) = merge(many, max_disjuncts=8)
    assert wide.filter is None  # past the cap: the whole table


# --- properties -------------------------------------------------------------------------

_OPS = ["<", "<=", ">", ">=", "="]
_atom = st.one_of(
    st.builds(
        lambda c, o, v: f'"t"."{c}" {o} {v}',
        st.sampled_from("ab"),
        st.sampled_from(_OPS),
        st.integers(-3, 3),
    ),
    st.builds(
        lambda c, lo, hi: f'"t"."{c}" BETWEEN {lo} AND {hi}',
        st.sampled_from("ab"),
        st.integers(-3, 3),
        st.integers(-3, 3),
    ),
    st.builds(
        lambda c, vs: f'"t"."{c}" IN ({", ".join(map(str, vs))})',
        st.sampled_from("ab"),
        st.lists(st.integers(-3, 3), min_size=1, max_size=3),
    ),
    st.sampled_from(['"t"."c" = \'x\'', '"t"."c" IS NULL']),
)
_clause = st.lists(_atom, min_size=1, max_size=3).map(" AND ".join)
_filter = st.one_of(
    st.none(),
    _clause,
    st.lists(_clause, min_size=2, max_size=3).map(lambda cs: " OR ".join(f"({c})" for c in cs)),
)
# Every value a filter can tell apart (the literals are whole numbers in -3..3): the check is
# exhaustive over that domain, not a sample of it.
_VALUES = [None, *(v / 2 for v in range(-9, 10))]
_GRID = [(a, b, c) for a in _VALUES for b in _VALUES for c in (None, "x", "y")]


def _grid() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute('CREATE TABLE "t" (a REAL, b REAL, c TEXT)')
    db.executemany('INSERT INTO "t" VALUES (?, ?, ?)', _GRID)
    return db


def _matching(db: sqlite3.Connection, filter_: str | None) -> set[int]:
    where = f" WHERE {filter_}" if filter_ else ""
    return {r[0] for r in db.execute(f'SELECT rowid FROM "t"{where}')}


@settings(max_examples=200, deadline=None)
@given(st.lists(_filter, min_size=1, max_size=2), _filter)
def test_covers_is_never_wrong(upstream: list[str | None], new: str | None) -> None:
    """Whenever covers says yes, every row of the whole domain the new filter matches is
    delivered by an upstream one (brute force over every distinguishable value)."""
    ups = [prim(f) for f in upstream]
    if not covers(ups, prim(new)):
        return
    db = _grid()
    delivered = set().union(*(_matching(db, f) for f in upstream))
    assert _matching(db, new) <= delivered


def test_single_range_atoms_are_decided_exactly() -> None:
    """Every pair of one-comparison filters: covers says yes exactly when the rows agree."""
    db = sqlite3.connect(":memory:")
    db.execute('CREATE TABLE "t" (a REAL)')
    db.executemany('INSERT INTO "t" VALUES (?)', [(v,) for v in _VALUES])
    atoms = [f'"t"."a" {op} {v}' for op in _OPS for v in range(-2, 3)]
    atoms += [f'"t"."a" BETWEEN {lo} AND {lo + 1}' for lo in range(-2, 2)] + ['"t"."a" IN (0, 1)']
    for up in atoms:
        for new in atoms:
            implied = _matching(db, new) <= _matching(db, up)
            assert covers([prim(up)], prim(new)) is implied, (up, new)


@settings(max_examples=100, deadline=None)
@given(st.lists(_filter, min_size=1, max_size=5))
def test_merge_covers_each_input(filters: list[str | None]) -> None:
    ps = [prim(f) for f in filters]
    (merged,) = merge(ps, max_disjuncts=3)
    assert all(covers([merged], p) for p in ps)
    db = _grid()
    assert set().union(*(_matching(db, f) for f in filters)) <= _matching(db, merged.filter)


_user_conds = ["u.age > 20", "u.age <= 40", "u.name = 'ada'", "u.age IS NULL", "u.id IN (1, 2, 3)"]
_email_conds = ["e.id > 11", "e.email LIKE '%a.org'", "e.id IS NULL", "e.user_id < 3"]
_cross_conds = ["u.age > e.id", "u.id = e.user_id OR e.id IS NULL"]


@st.composite
def _views(draw: st.DrawFn) -> str:
    join = draw(st.sampled_from(["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN", "CROSS JOIN"]))
    on = [
        "u.id = e.user_id",
        *draw(st.lists(st.sampled_from(_user_conds + _email_conds), max_size=2)),
    ]
    where = draw(st.lists(st.sampled_from(_user_conds + _email_conds + _cross_conds), max_size=3))
    sql = "SELECT u.id, u.name, u.age, e.id, e.email FROM users u "
    sql += (
        "CROSS JOIN emails e" if join == "CROSS JOIN" else f"{join} emails e ON {' AND '.join(on)}"
    )
    return sql + (f" WHERE {' AND '.join(where)}" if where else "")


_users = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.integers(1, 6),
            "name": st.sampled_from(["ada", "bob", None]),
            "age": st.one_of(st.none(), st.integers(10, 50)),
        }
    ),
    max_size=6,
    unique_by=lambda r: r["id"],
)
_emails = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.integers(10, 16),
            "user_id": st.one_of(st.none(), st.integers(1, 6)),
            "email": st.sampled_from(["x@a.org", "y@b.org", None]),
        }
    ),
    max_size=6,
    unique_by=lambda r: r["id"],
)


def _database(users: list[dict[str, Any]], emails: list[dict[str, Any]]) -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE users (id INTEGER, name TEXT, age INTEGER)")
    db.execute("CREATE TABLE emails (id INTEGER, user_id INTEGER, email TEXT)")
    db.executemany("INSERT INTO users VALUES (:id, :name, :age)", users)
    db.executemany("INSERT INTO emails VALUES (:id, :user_id, :email)", emails)
    return db


@settings(max_examples=150, deadline=None)
@given(_views(), _users, _emails)
def test_the_primitives_rows_are_enough_and_evaluation_agrees_with_sqlite(
    sql: str, users: list[dict[str, Any]], emails: list[dict[str, Any]]
) -> None:
    """The view on only its primitives' rows (what upstream sends), or on all rows, gives
    what the same validated SQL gives on a real SQLite database with every row."""
    view = SqlView.parse(sql, CATALOG)
    db = _database(users, emails)
    cursor = db.execute(view.sql)
    expected = sorted(cursor.fetchall(), key=lambda r: [(v is not None, v) for v in r])
    assert rows(state_of(users, emails).evaluate(view)) == expected
    narrowed = TableState(CATALOG)
    for p in view.primitives:
        sql = p.sql if "id" in p.columns else p.sql.replace("SELECT ", 'SELECT "id", ', 1)
        cur = db.execute(sql)  # what the upstream sends for the primitive (with the key)
        names = [d[0] for d in cur.description]
        columns = list(zip(*cur.fetchall(), strict=True)) or [()] * len(names)
        narrowed.upsert(
            p.table, pa.table({n: list(c) for n, c in zip(names, columns, strict=True)}), key="id"
        )
    assert rows(narrowed.evaluate(view)) == expected
