"""Tasks see routing changes of the YAML file, and only those; a broken file changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
import yaml

from tests.support.helpers import relay_config
from tidings.pipeline.jobconfig import job_config, job_options, started_config


def _write(path: Path, text: str, bump: int) -> None:
    path.write_text(text)
    stamp = path.stat().st_mtime + bump  # a distinct mtime even within one clock tick
    os.utime(path, (stamp, stamp))


def test_routing_reloads_but_database_and_targets_stay(tmp_path: Path) -> None:
    config = relay_config(tmp_path, routes={"A": ["store"]})
    path = tmp_path / "tidings.yaml"
    data = config.model_dump(mode="json")
    _write(path, yaml.safe_dump(data), 0)
    options = job_options(config, str(path))
    assert job_config(options).routing.routes == {"A": ["store"]}

    data["routing"]["routes"]["B"] = ["store"]
    data["database"]["url"] = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    _write(path, yaml.safe_dump(data), 1)
    reloaded = job_config(options)
    assert reloaded.routing.routes == {"A": ["store"], "B": ["store"]}
    assert reloaded.database.url == config.database.url  # never switches databases mid-run

    _write(path, "", 2)  # an editor truncated the file
    assert job_config(options).routing.routes == {"A": ["store"], "B": ["store"]}
    _write(path, "routing: {routes: {C: [nowhere]}}\n", 3)  # invalid: unknown target
    assert job_config(options).routing.routes == {"A": ["store"], "B": ["store"]}


def test_a_task_decodes_the_started_configuration_once_and_cannot_change_it(
    tmp_path: Path,
) -> None:
    """Every task and commit asks for it; the decoded model is shared, which is safe only
    because a validated configuration is frozen."""
    options = job_options(relay_config(tmp_path), None)
    first = started_config(options)
    assert started_config(dict(options)) is first
    other = job_options(relay_config(tmp_path / "other"), None)
    assert started_config(other) is not first
    assert started_config(other).database.url != first.database.url
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        first.relay.partitions = 7  # type: ignore[misc]


def test_the_source_plans_from_plain_options_without_loading_the_configuration(
    tmp_path: Path,
) -> None:
    """The streaming source runner is a new Python process per query: what it imports is
    every relay start's wait. It reads the log's bounds from the job's plain options, on
    the real database, and never loads pydantic, the configuration models or a target."""
    config = relay_config(tmp_path)
    options = job_options(config, None)
    probe = (
        "import json, sys\n"
        "from tidings.pipeline.source.queries import LogReader\n"
        "log = LogReader(json.loads(sys.argv[1]))\n"
        "print(json.dumps([log.start(), log.safe_upto(), log.partition_count, log.max_rows,\n"
        "    sorted(m for m in sys.modules if m == 'pydantic' or m.startswith(\n"
        "        ('tidings.config', 'tidings.targets', 'sqlalchemy.orm')))]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(options)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    start, upto, partitions, max_rows, loaded = json.loads(out)
    assert (start, upto) == (0, 0)
    assert (partitions, max_rows) == (config.relay.partitions, config.relay.max_events_per_batch)
    assert loaded == []
