"""Configuration: one validated model, errors that name the key and the value."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from tidings.config import load_config, load_config_file, parse_duration
from tidings.errors import ConfigError


def test_defaults_are_the_embedded_setup() -> None:
    config = load_config({})
    assert config.database.url.startswith("sqlite:///")
    assert config.relay.spark_master == "local[*]"
    assert config.relay.retry_backoff == [timedelta(milliseconds=ms) for ms in (10, 25, 40)]
    assert config.outbox.max_payload_bytes == 1024 * 1024


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"relay": {"partitions": 0}}, "relay.partitions"),
        ({"relay": {"trigger_interval": "soon"}}, "'soon'"),
        ({"relay": {"retry_backoff": "10ms"}}, "relay.retry_backoff"),
        ({"databse": {"url": "x"}}, "databse: unknown key"),
        ({"database": {"url": "mysql://x"}}, "mysql://x"),
        ({"targets": {"t": {"kind": "kafka"}}}, "kafka"),
        (
            {"targets": {"t": {"kind": "jetstream", "stream": "S"}}},
            "targets.t.jetstream.subject_prefix",
        ),
        ({"routing": {"routes": {"A": ["nowhere"]}}}, "unknown target 'nowhere'"),
    ],
)
def test_bad_config_names_key_and_value(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(data)
    assert needle in str(excinfo.value)


def test_durations() -> None:
    assert parse_duration("250ms") == timedelta(milliseconds=250)
    assert parse_duration("30m") == timedelta(minutes=30)
    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration(1.5) == timedelta(seconds=1.5)
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("-3s")


def test_config_survives_json_round_trip() -> None:
    config = load_config({"relay": {"retry_backoff": ["10ms", "2s"], "replay_every": "30m"}})
    again = type(config).model_validate_json(config.model_dump_json())
    assert again == config


def test_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("relay: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config_file(bad)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("relay:\n  max_events_per_batch: -5\n")
    with pytest.raises(ConfigError, match=r"relay\.max_events_per_batch.*-5"):
        load_config_file(wrong)
