"""The driver JVM's class archive: used only when configured and made; making it needs a
path (the making itself, through ``tidings relay --make-class-archive``, is in
tests/cli/test_relay.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidings.config import RelayConfig, TidingsConfig
from tidings.errors import RelayError
from tidings.pipeline.class_archive import driver_java_options, make_class_archive


def test_without_an_archive_the_java_options_are_the_configured_ones() -> None:
    config = RelayConfig(driver_java_options="-XX:TieredStopAtLevel=1")
    assert driver_java_options(config) == "-XX:TieredStopAtLevel=1"


def test_an_archive_not_made_yet_is_not_named_to_the_jvm(tmp_path: Path) -> None:
    config = RelayConfig(jvm_class_archive=str(tmp_path / "spark.jsa"))
    assert "SharedArchiveFile" not in driver_java_options(config)


def test_a_made_archive_is_named_to_the_jvm(tmp_path: Path) -> None:
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"made")
    config = RelayConfig(driver_java_options="-Xss4m", jvm_class_archive=str(archive))
    assert driver_java_options(config) == f"-Xss4m -XX:SharedArchiveFile={archive}"


def test_making_an_archive_needs_its_path() -> None:
    with pytest.raises(RelayError, match=r"relay\.jvm_class_archive is not set"):
        make_class_archive(TidingsConfig())
