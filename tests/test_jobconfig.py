"""Tasks see routing changes of the YAML file, and only those; a broken file changes nothing."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from helpers import relay_config
from tidings.pipeline.jobconfig import job_config, job_options


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
