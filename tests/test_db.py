"""The engines tidings makes name their database in a database's errors, and leave every
other error as it is."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from tidings.db import DATABASE_ATTRIBUTE, make_engine


def test_an_error_not_the_databases_stays_itself(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/a.db")
    # sqlite3 refuses an int past 64 bits before the database sees it: no database error
    # to name, and the listener must not turn it into an AttributeError.
    with engine.connect() as conn, pytest.raises(OverflowError):
        conn.execute(text("SELECT :n"), {"n": 2**64})
    with engine.connect() as conn, pytest.raises(OperationalError) as caught:
        conn.execute(text("SELECT * FROM missing"))
    assert getattr(caught.value, DATABASE_ATTRIBUTE) == f"sqlite:///{tmp_path}/a.db"
    engine.dispose()
