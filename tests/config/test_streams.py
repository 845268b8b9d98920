"""The streams' configuration: the sections of the event server's file, password hashes
from the environment, the aggregation job's file."""

from __future__ import annotations

import pytest

from tests.support.stream_helpers import PASSWORD_HASH, USER, stream_server_config
from tidings.config.passwords import hash_password
from tidings.config.streams import load_stream_server_config
from tidings.errors import ConfigError
from tidings.streams.typemap import type_map_from_config


def test_config_refuses_bad_streams_with_the_key_named(tmp_path) -> None:
    good = stream_server_config(f"sqlite:///{tmp_path}/x.db")
    assert type_map_from_config(load_stream_server_config(good).streams[0].types).names == (
        "ORDER",
        "PAY",
        "AUDIT",
    )
    bad_types = good | {"streams": [good["streams"][0] | {"types": {"bad": ["x"]}}]}
    with pytest.raises(ConfigError, match=r"streams\.0\.types.*cannot be an FTN18 type"):
        load_stream_server_config(bad_types)
    twice = good | {"streams": [good["streams"][0], good["streams"][0] | {"name": "t"}]}
    with pytest.raises(ConfigError, match="same host, port and path"):
        load_stream_server_config(twice)
    clear = good | {"stream_users": {USER: {"password_hash": "secret"}}}
    with pytest.raises(ConfigError, match="scrypt"):
        load_stream_server_config(clear)
    with pytest.raises(ConfigError, match="tls_keyfile"):
        load_stream_server_config(
            good | {"streams": [good["streams"][0] | {"tls_certfile": "c.pem"}]}
        )


def test_password_hash_from_the_environment(monkeypatch, tmp_path) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/x.db")
    config["stream_users"] = {USER: {"password_hash_env": "TIDINGS_TEST_HASH"}}
    loaded = load_stream_server_config(config)
    monkeypatch.delenv("TIDINGS_TEST_HASH", raising=False)
    with pytest.raises(ConfigError, match="TIDINGS_TEST_HASH is not set"):
        loaded.stream_users[USER].resolved_hash(USER)
    monkeypatch.setenv("TIDINGS_TEST_HASH", PASSWORD_HASH)
    assert loaded.stream_users[USER].resolved_hash(USER) == PASSWORD_HASH


def test_aggregation_configuration_is_checked() -> None:
    from tidings.config import validate_config
    from tidings.config.streams import AggregateConfig

    source = {"url": "http://h:1/evt", "user": "u", "password_env": "P", "component": "AGG"}
    good = {"sources": {"eu": source}, "destination": {"database": "sqlite:///a.db"}}
    config = validate_config(AggregateConfig, good, "aggregation")
    assert config.sources["eu"].options()["password_env"] == "P"
    assert config.destination.type_prefix == ["aggregate"]
    for bad, fragment in [
        (good | {"sources": {}}, "at least one source"),
        (good | {"sources": {"bad name": source}}, "source name"),
        (good | {"sources": {"eu": source | {"component": "LIVE"}}}, "LIVE cannot"),
        (good | {"sources": {"eu": source | {"password": "x"}}}, "unknown key"),
        (good | {"sources": {"eu": source | {"url": "ftp://x"}}}, "url"),
    ]:
        with pytest.raises(ConfigError, match=fragment):
            validate_config(AggregateConfig, bad, "aggregation")


def test_the_example_stream_configuration_loads(monkeypatch) -> None:
    from pathlib import Path

    from tidings.config.streams import load_stream_server_config_file

    monkeypatch.setenv("TIDINGS_APP_HASH", hash_password("s3cret", n=2**4))
    example = Path(__file__).resolve().parents[2] / "examples" / "server-streams.yaml"
    config = load_stream_server_config_file(example)
    [stream] = config.streams
    assert type_map_from_config(stream.types).event_type_of("ORDER_PLACED") == (
        "orders",
        "OrderPlaced",
    )
    assert config.stream_users["app"].resolved_hash("app").startswith("scrypt$")
    [grant] = config.stream_users["app"].allow or []
    assert grant.add_event == ["ORDER_PLACED", "ORDER_SHIPPED"]
