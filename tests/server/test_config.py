"""The event server's configuration: hat-event's server.yaml keys, peers, defaults, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.helpers import assert_unreadable_files_fail
from tidings.config.server import (
    default_config_path,
    load_server_config,
    load_server_config_file,
)
from tidings.errors import ConfigError
from tidings.server.backends import open_backend

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def minimal(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {
        "type": "event",
        "backend": {"module": "tidings.server.backends.sqlite", "db_path": "events.db"},
        "engine": {"server_id": 1, "modules": []},
        "eventer_server": {"address": "tcp+sbs://127.0.0.1:23012"},
    }
    data.update(changes)
    return data


def test_example_configuration_loads_with_paths_relative_to_its_directory() -> None:
    config = load_server_config_file(EXAMPLES / "server.yaml")
    assert config.engine.server_id == 1
    assert config.eventer_server.address == "tcp+sbs://127.0.0.1:23012"
    assert config.syncer_server is not None
    assert config.syncer_server.address == "tcp+sbs://127.0.0.1:23013"
    assert config.base_dir == EXAMPLES
    assert config.resolve("data/events.db") == EXAMPLES / "data" / "events.db"


def test_example_pair_points_at_each_other() -> None:
    a = load_server_config_file(EXAMPLES / "server-a.yaml")
    b = load_server_config_file(EXAMPLES / "server-b.yaml")
    assert a.syncer_server is not None and b.syncer_server is not None
    assert [p.address for p in a.syncer_peers] == [b.syncer_server.address]
    assert [p.address for p in b.syncer_peers] == [a.syncer_server.address]
    assert [p.server_id for p in a.syncer_peers] == [b.engine.server_id]


def test_defaults_follow_hat_event() -> None:
    data = minimal()
    del data["eventer_server"]
    config = load_server_config(data)
    assert config.eventer_server.address == "tcp+sbs://127.0.0.1:23012"
    assert config.syncer_server is None
    assert config.engine.max_session_events == 10_000


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"type": "gateway"}, "type"),
        ({"engine": {"modules": []}}, "engine.server_id: required key is missing"),
        ({"engine": {"server_id": 0, "modules": []}}, "engine.server_id"),
        ({"eventer_server": {"address": "http://127.0.0.1:1"}}, "eventer_server.address"),
        ({"eventer_server": {"address": "tcp+sbs://127.0.0.1"}}, "tcp+sbs://HOST:PORT"),
        ({"syncer_server": {"address": "tcp+sbs://:5"}}, "syncer_server.address"),
        ({"backend": {}}, "backend.module: required key is missing"),
        ({"unknown_key": 1}, "unknown_key: unknown key"),
        ({"monitor": {"name": "a"}}, "monitor.group: required key is missing"),
        (
            {"monitor": {"name": "a", "group": "g", "monitor_address": "tcp://x"}},
            "monitor.monitor_address",
        ),
        ({"mariner_server": {"address": "tcp://x:1"}}, "Mariner"),
        ({"engine": {"server_id": 1, "modules": [{}]}}, "engine.modules.0.module"),
    ],
)
def test_bad_configuration_names_the_key(changes: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError, match="invalid server configuration") as info:
        load_server_config(minimal(**changes))
    assert expected in str(info.value)


def test_peers_need_matching_tokens_and_distinct_ids() -> None:
    peer = {"server_id": 2, "address": "tcp+sbs://127.0.0.1:1", "syncer_token": "x"}
    ok = load_server_config(minimal(syncer_token="x", syncer_peers=[peer]))
    assert ok.syncer_peers[0].server_id == 2
    with pytest.raises(ConfigError, match=r"syncer_peers.0.syncer_token: does not match") as info:
        load_server_config(minimal(syncer_token="y-token", syncer_peers=[peer]))
    assert "y-token" not in str(info.value)  # a token is a secret: named, never shown
    with pytest.raises(ConfigError, match=r"this server.s own engine\.server_id"):
        load_server_config(minimal(syncer_token="x", syncer_peers=[{**peer, "server_id": 1}]))
    with pytest.raises(ConfigError, match="same server_id"):
        load_server_config(minimal(syncer_token="x", syncer_peers=[peer, peer]))


def test_monitor_section_is_hat_monitors_client_configuration() -> None:
    monitor = {"name": "event-a", "group": "event", "monitor_address": "tcp+sbs://127.0.0.1:1"}
    config = load_server_config(minimal(monitor=monitor))
    assert config.monitor is not None
    assert (config.monitor.name, config.monitor.group) == ("event-a", "event")
    assert config.monitor.monitor_address == "tcp+sbs://127.0.0.1:1"
    peer = {"server_id": 2, "address": "tcp+sbs://127.0.0.1:2"}
    with pytest.raises(ConfigError, match="syncer_peers: not with monitor"):
        load_server_config(minimal(monitor=monitor, syncer_peers=[peer]))


def test_peer_token_must_match_and_peer_id_and_address_must_be_valid() -> None:
    """The peer checks the Syncer client trusts (it checked them itself before): a missing
    token on either side differs from a set one, both absent are equal, as in hat-event."""
    peer = {"server_id": 2, "address": "tcp+sbs://127.0.0.1:1234"}
    mismatch = r"syncer_peers.0.syncer_token: does not match this server's syncer_token"
    with pytest.raises(ConfigError, match=mismatch) as info:
        load_server_config(
            minimal(syncer_token="ours", syncer_peers=[{**peer, "syncer_token": "theirs"}])
        )
    assert "ours" not in str(info.value) and "theirs" not in str(info.value)
    with pytest.raises(ConfigError, match="syncer_token: not set, but this server has one"):
        load_server_config(minimal(syncer_token="ours", syncer_peers=[peer]))
    with pytest.raises(ConfigError, match="syncer_token: set, but this server has no"):
        load_server_config(minimal(syncer_peers=[{**peer, "syncer_token": "theirs"}]))
    with pytest.raises(ConfigError, match=r"this server.s own engine\.server_id"):
        load_server_config(minimal(syncer_peers=[{**peer, "server_id": 1}]))
    with pytest.raises(ConfigError, match=r"syncer_peers.0.address"):
        load_server_config(minimal(syncer_peers=[{**peer, "address": "http://127.0.0.1:1234"}]))
    for bad_id in (0, "two"):
        with pytest.raises(ConfigError, match=r"syncer_peers.0.server_id"):
            load_server_config(minimal(syncer_peers=[{**peer, "server_id": bad_id}]))
    same = load_server_config(
        minimal(syncer_token="same", syncer_peers=[{**peer, "syncer_token": "same"}])
    )
    assert same.syncer_peers[0].syncer_token == "same"
    assert load_server_config(minimal(syncer_peers=[peer])).syncer_peers[0].server_id == 2


def test_default_path_is_under_xdg_config_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="pass --conf PATH"):
        default_config_path()
    (tmp_path / "tidings").mkdir()
    (tmp_path / "tidings" / "event.json").write_text('{"type": "event"}')
    assert default_config_path() == tmp_path / "tidings" / "event.json"
    (tmp_path / "tidings" / "event.yml").write_text(yaml.safe_dump(minimal()))
    assert default_config_path() == tmp_path / "tidings" / "event.yml"
    config = load_server_config_file()
    assert config.base_dir == tmp_path / "tidings"


def test_unreadable_or_invalid_files_are_config_errors(tmp_path: Path) -> None:
    assert_unreadable_files_fail(
        load_server_config_file,
        tmp_path,
        missing="cannot read configuration file",
        not_yaml="type: [event\n",
    )
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_server_config_file(listed)


def test_sqlite_backend_opens_a_store_relative_to_the_config(tmp_path: Path) -> None:
    store = open_backend(
        "tidings.server.backends.sqlite", {"db_path": "sub/events.db"}, 3, tmp_path
    )
    try:
        assert store.server_id == 3
        assert (tmp_path / "sub" / "events.db").exists()
    finally:
        store.close()


@pytest.mark.parametrize(
    ("module", "options", "expected"),
    [
        ("tidings.server.backends.sqlite", {}, "db_path: required key is missing"),
        ("tidings.server.backends.sqlite", {"db_path": "x", "path": 1}, "path: unknown key"),
        ("tidings.server.backends.postgresql", {"url": "mysql://x"}, "backend (postgresql)"),
        ("no.such.backend", {}, "cannot import 'no.such.backend'"),
        ("tidings.config.server", {}, "has no create"),
    ],
)
def test_bad_backend_configuration(
    tmp_path: Path, module: str, options: dict[str, object], expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        open_backend(module, options, 1, tmp_path)
    assert expected in str(info.value)


@pytest.mark.postgres
def test_postgresql_backend_opens_a_store(pg_url: str, tmp_path: Path) -> None:
    store = open_backend("tidings.server.backends.postgresql", {"url": pg_url}, 5, tmp_path)
    try:
        assert store.server_id == 5
        assert store.count() == 0
    finally:
        store.close()
