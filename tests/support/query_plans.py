"""What SQLite plans for the SELECTs a piece of code runs: the tests that promise a read stays
cheap on a log of any size check that it searches an index, never scans a table."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine, event


def sqlite_plans(engine: Engine, action: Callable[[], object]) -> list[tuple[str, list[str]]]:
    """Each SELECT ``action`` runs on ``engine`` (the schema check's own left out), with the
    steps of its plan as SQLite's ``EXPLAIN QUERY PLAN`` gives them."""
    statements: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "tidings_meta" not in statement:
            statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        action()
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    raw = engine.raw_connection()
    try:
        return [
            (
                statement,
                [
                    row[-1]
                    for row in raw.cursor().execute(f"EXPLAIN QUERY PLAN {statement}", parameters)
                ],
            )
            for statement, parameters in statements
        ]
    finally:
        raw.close()


def reads(plan: list[str]) -> list[str]:
    """The steps of ``plan`` that read a table or an index (``SCAN`` or ``SEARCH``)."""
    return [step for step in plan if step.startswith(("SCAN", "SEARCH"))]
