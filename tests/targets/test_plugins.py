"""Target kinds brought by installed packages (plug-ins), beside the built-in ones.

The plug-in is a real distribution as pip leaves it in a ``site-packages``: its package and
its ``*.dist-info`` (METADATA, ``entry_points.txt``, RECORD), written into a folder that is
put on the path. ``importlib.metadata`` finds it there exactly as it finds an installed one;
a wheel is not built because the dev environment has no ``wheel`` to build it with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from importlib.metadata import Distribution
from pathlib import Path

import pytest
import yaml

from tests.support.helpers import statuses
from tidings.db import make_engine
from tidings.errors import ConfigError
from tidings.outbox.producer import Outbox
from tidings.outbox.schema import ensure_schema
from tidings.targets.registry import _KINDS, _plugin_kinds

ROOT = Path(__file__).resolve().parents[2]

#: A whole target kind, as a service would write it: its model and its class.
ECHO_MODULE = '''
"""Appends every event to a file: a target kind of the tidings-echo package."""

import json
from typing import Literal

from tidings.config import LocalPath, TargetConfig
from tidings.targets.base import Target


class EchoConfig(TargetConfig):
    kind: Literal["echo_file"]
    path: LocalPath


class EchoTarget(Target):
    config_model = EchoConfig

    def __init__(self, name, config):
        super().__init__(name)
        self.path = config.path

    def publish(self, events):
        with open(self.path, "a") as out:
            for event in events:
                out.write(json.dumps({"id": event.event_id, "key": event.partition_key}) + "\\n")
        return [None] * len(events)
'''


def install(site: Path, package: str, module: str, entry_points: str) -> None:
    """``package`` (version 1.0) into ``site`` as pip installs one: its module (the
    package's name with ``_`` for ``-``) and its dist-info with these entry points."""
    name = package.replace("-", "_")
    (site / f"{name}.py").write_text(textwrap.dedent(module))
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text(f"{name}.py,,\n{info.name}/METADATA,,\n")


def site_with_echo(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    points = "[tidings.targets]\necho_file = tidings_echo:EchoTarget\n"
    install(site, "tidings-echo", ECHO_MODULE, points)
    return site


def run(site: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "tidings.cli", *args],
        cwd=site.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_config(tmp_path: Path, target: dict[str, object]) -> Path:
    config = {
        "database": {"url": f"sqlite:///{tmp_path / 'app.db'}"},
        "targets": {"echo": target},
        "routing": {"routes": {"Created": ["echo"]}},
        "relay": {"checkpoint_dir": str(tmp_path / "checkpoint"), "partitions": 1},
    }
    path = tmp_path / "tidings.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_plugin_kind_is_validated_like_a_built_in_one(tmp_path: Path) -> None:
    site = site_with_echo(tmp_path)
    good = write_config(tmp_path, {"kind": "echo_file", "path": "out.jsonl"})

    checked = run(site, "config", "check", "-c", str(good))

    assert checked.returncode == 0, checked.stderr
    target = yaml.safe_load(checked.stdout)["targets"]["echo"]
    assert target == {"kind": "echo_file", "fault_file": None, "path": str(tmp_path / "out.jsonl")}

    bad = write_config(tmp_path, {"kind": "echo_file", "paht": "out.jsonl"})
    refused = run(site, "config", "check", "-c", str(bad))
    assert refused.returncode == 2
    assert "targets.echo.echo_file.paht: unknown key" in refused.stderr
    assert "targets.echo.echo_file.path: required key is missing" in refused.stderr


@pytest.mark.spark
@pytest.mark.slow
def test_the_relay_publishes_through_a_plugin_target(tmp_path: Path) -> None:
    site = site_with_echo(tmp_path)
    path = write_config(tmp_path, {"kind": "echo_file", "path": "out.jsonl"})
    engine = make_engine(f"sqlite:///{tmp_path / 'app.db'}")
    ensure_schema(engine)
    outbox = Outbox(engine)
    emitted = []
    for n in range(5):
        with outbox.transaction() as tx:
            emitted.append(tx.emit("Created", {"n": n}, partition_key=f"k{n % 2}"))

    relayed = run(site, "relay", "--once", "-c", str(path))

    assert relayed.returncode == 0, relayed.stderr[-3000:]
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["id"] for line in lines) == sorted(emitted)
    assert set(statuses(engine).values()) == {"PUBLISHED"}


@pytest.mark.parametrize(
    ("module", "entry", "message"),
    [
        ("import no_such_module\n", "broken = {module}:Thing", "cannot be loaded"),
        ("Thing = 42\n", "thing = {module}:Thing", "is no target kind"),
        (ECHO_MODULE, "jetstream = {module}:EchoTarget", "is taken already (by tidings"),
        (ECHO_MODULE, "echo = {module}:EchoTarget", "must declare kind: Literal['echo']"),
    ],
)
def test_a_broken_or_clashing_plugin_is_an_error_naming_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, entry: str, message: str
) -> None:
    package = f"tidings-bad-{uuid.uuid4().hex[:8]}"  # a module of its own for each case
    entry = entry.format(module=package.replace("-", "_"))
    install(tmp_path, package, module, f"[tidings.targets]\n{entry}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (dist,) = Distribution.discover(path=[str(tmp_path)])

    with pytest.raises(ConfigError) as raised:
        _plugin_kinds(dict(_KINDS), dist.entry_points)

    assert f"package {package!r}" in str(raised.value) and message in str(raised.value)
