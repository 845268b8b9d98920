"""Commands that used to answer carelessly: an id that is not an event id, a target that
does not exist. Run as an operator runs them (``python -m tidings.cli``, a real SQLite log
with a FAILED event): one line naming the problem, exit 2, and nothing changed in the log,
the good ids given beside a bad one included."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli_runs import one_error_line, run_tidings
from tests.support.helpers import relay_config, statuses
from tidings.db import make_engine

GOOD = "{good}"  # stands for the FAILED event's id in the arguments below


def _refused(log: Path, tmp_path: Path, args: list[str]) -> str:
    """The one error line of ``tidings ARGS -c LOG``, which must leave the log as it was
    (its seq 2 still FAILED)."""
    engine = make_engine(relay_config(tmp_path).database.url)
    before = statuses(engine)
    line = one_error_line(run_tidings(*args, "-c", str(log)))
    assert statuses(engine) == before and before[2] == "FAILED"
    return line


@pytest.mark.parametrize(
    "args",
    [
        ["events", "park", GOOD, "not-a-uuid", "--reason", "x"],
        ["events", "unpark", "not-a-uuid"],
        ["events", "list", "--id", "not-a-uuid"],
        ["events", "resubmit", "--id", GOOD, "--id", "not-a-uuid"],
    ],
    ids=["park", "unpark", "list", "resubmit"],
)
def test_an_id_that_is_not_an_event_id_is_refused(
    incomplete_log: tuple[Path, list[str]], tmp_path: Path, args: list[str]
) -> None:
    path, ids = incomplete_log
    given = [ids[1] if arg == GOOD else arg for arg in args]  # ids[1] is FAILED
    assert _refused(path, tmp_path, given) == (
        "error: 'not-a-uuid' is not an event id (event ids are UUIDs, as `events list` shows them)"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["events", "resubmit", "--target", "nosuch"],
        ["events", "list", "--target", "nosuch"],
        ["routes", "add", "OrderPlaced", "nosuch"],
    ],
    ids=["resubmit", "list", "routes-add"],
)
def test_an_unknown_target_is_refused_the_same_way_everywhere(
    incomplete_log: tuple[Path, list[str]], tmp_path: Path, args: list[str]
) -> None:
    path, _ = incomplete_log
    assert _refused(path, tmp_path, args) == "error: unknown target 'nosuch' (defined: store)"
