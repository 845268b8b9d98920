"""Careless configuration refused in one line naming the problem: a key written twice, a file
that is not text, a target without a kind, intervals and sizes out of bounds, an error about
a whole section (not the whole file echoed), a secret's value never shown."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import tidings.targets.registry  # noqa: F401 - enters the target kinds the files name
from tidings.cli import app
from tidings.config import load_config, load_config_file
from tidings.config.streams import load_stream_server_config
from tidings.errors import ConfigError

runner = CliRunner()


def _write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "tidings.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_a_key_written_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    path = _write(
        tmp_path, "targets:\n  a: {kind: event_store}\n  b: {kind: event_store}\n  a: {}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config_file(path)
    message = str(caught.value)
    assert "key 'a' appears twice in one mapping (lines 2 and 4)" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"\xff\xfe\x00b\x00", "not a UTF-8 text file (byte 0xff at offset 0)"),
        (b"relay: {}\n\x00\x00", "not a text file (it holds NUL bytes)"),
    ],
)
def test_a_file_that_is_not_text_is_one_line_for_config_check_and_the_server(
    tmp_path: Path, content: bytes, said: str
) -> None:
    path = _write(tmp_path, content)
    for args in (["config", "check", "-c", str(path)], ["server", "--conf", str(path)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert said in result.output and "Traceback" not in result.output


def test_a_target_without_a_kind_names_the_kinds() -> None:
    with pytest.raises(ConfigError, match=r"targets\.a: .*kind is required: one of event_server, "):
        load_config({"targets": {"a": {"url": "sqlite:///x.db"}}})


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (
            {"relay": {"trigger_interval": "0s"}},
            "relay.trigger_interval: must be more",
        ),
        ({"relay": {"max_events_per_batch": 2**64}}, "relay.max_events_per_batch: Input should be"),
        ({"replay": {"time_limit": "0s"}}, "replay.time_limit: must be more than 0s"),
        ({"relay": {"retry": {"initial_backoff": "2d"}}}, "at most 1h (got 2d)"),
        ({"intermediary": {"tick": "1h"}}, "intermediary.tick: must be more than 0s"),
    ],
)
def test_intervals_and_sizes_have_bounds(data: dict, said: str) -> None:
    with pytest.raises(
        ConfigError, match=said.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")
    ):
        load_config(data)


def test_a_stream_retention_pass_every_0s_is_refused() -> None:
    server = {
        "type": "event",
        "backend": {"module": "tidings.server.backends.sqlite", "db_path": "x.db"},
        "engine": {"server_id": 1},
        "stream_users": {"u": {"password_hash_env": "H"}},
        "streams": [
            {"name": "s", "port": 8090, "types": {"A": ["a"]}, "retention": {"every": "0s"}}
        ],
    }
    with pytest.raises(ConfigError, match=r"retention\.every: .*at least 10ms and at most 1d"):
        load_stream_server_config(server)


def test_an_error_about_a_section_shows_its_size_not_its_content_and_no_secret() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(
            {
                "outbox": ["a", "b", "c"],
                "relay": {"checkpoint_dir": "x", "nonsense": {"p": 1, "q": 2}},
                "targets": {"t": {"kind": "event_server", "address": "tcp+sbs://h:1", "token": 5}},
            }
        )
    message = str(caught.value)
    assert "outbox: " in message and "(got a list of 3 items)" in message
    # Refused keys are named, never echoed: a misplaced key may hold a secret.
    lines = [line.strip() for line in message.splitlines()]
    assert "relay.nonsense: unknown key" in lines
    assert "targets.t.event_server.token: unknown key" in lines
    assert "'a', 'b'" not in message and "'p'" not in message and "5" not in message


def test_config_check_names_a_path_it_cannot_write(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    path = _write(
        tmp_path,
        f"database: {{url: 'sqlite:///{blocker}/app.db'}}\n"
        f"relay: {{checkpoint_dir: {blocker}/cp}}\n",
    )
    result = runner.invoke(app, ["config", "check", "-c", str(path)])
    assert result.exit_code == 2
    assert f"error: database.url {blocker}/app.db: cannot be created ({blocker} is a file)" in (
        result.output
    )
    assert f"error: relay.checkpoint_dir {blocker}/cp: cannot be created" in result.output


def test_our_own_checks_speak_without_pydantics_value_error_prefix() -> None:
    """A check of ours says what is wrong; pydantic's ``Value error, `` in front of it says
    only which exception carried it, and is left out. Pydantic's own messages are kept."""
    with pytest.raises(ConfigError) as caught:
        load_config({"intermediary": {"listen": "8100"}, "relay": {"partitions": 0}})
    message = str(caught.value)
    assert "intermediary.listen: expected HOST:PORT, e.g. 127.0.0.1:8100, got '8100'" in message
    assert "relay.partitions: Input should be greater than 0 (got 0)" in message
    assert "Value error" not in message
    archive = ["streams", "archive", "http://127.0.0.1:1/s", "--dir", "a", "--checkpoint", "c"]
    result = runner.invoke(app, [*archive, "--user", "u", "--component", "LIVE"])
    assert result.exit_code == 2, result.output
    assert "component: LIVE cannot be registered" in result.output
    assert "Value error" not in result.output


def test_merge_keys_repeat_a_mapping_and_a_key_given_beside_them_wins(tmp_path: Path) -> None:
    """``<<: *name`` is YAML's way to write a mapping once: it is no key written twice, and a
    key given beside it replaces the merged one; a key written twice is still refused."""
    text = (
        "targets:\n"
        "  a: &store {kind: event_store, url: 'sqlite:///a.db', type_prefix: [shop]}\n"
        "  b:\n"
        "    <<: *store\n"
        "    url: 'sqlite:///b.db'\n"
    )
    config = load_config_file(_write(tmp_path, text))
    a, b = config.targets["a"], config.targets["b"]
    assert (a.kind, b.kind) == ("event_store", "event_store")
    assert getattr(b, "type_prefix", None) == ["shop"]
    assert getattr(a, "url", "").endswith("/a.db") and getattr(b, "url", "").endswith("/b.db")
    with pytest.raises(
        ConfigError, match=r"key 'url' appears twice in one mapping \(lines 5 and 6\)"
    ):
        load_config_file(_write(tmp_path, text + "    url: 'sqlite:///c.db'\n"))


def _server_file(**changes: object) -> dict[str, object]:
    return {
        "type": "event",
        "backend": {"module": "tidings.server.backends.sqlite", "db_path": "x.db"},
        "engine": {"server_id": 1},
        "stream_users": {"app": {"password_hash_env": "H"}},
        "streams": [{"name": "s", "port": 8090, "types": {"A": ["a"]}}],
        **changes,
    }


def test_a_clear_stream_password_is_refused_with_how_to_hash_it_and_not_echoed(
    forgotten_secrets: None,
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_stream_server_config(_server_file(stream_users={"app": {"password": "s3cret-pw"}}))
    message = str(caught.value)
    assert "s3cret-pw" not in message
    assert "stream_users.app: password: clear passwords are not accepted" in message
    assert "tidings streams hash-password" in message and "password_hash_env" in message


def test_no_error_of_a_file_echoes_a_refused_value_a_secret_or_the_whole_file(
    tmp_path: Path, forgotten_secrets: None
) -> None:
    """A misspelt key may hold a password (``pasword: ...``); a top-level check sees the
    whole file; a database URL carries its password: none of them reaches the message."""
    secrets = ["s3cret-pw", "tok-theirs", "tok-ours", "dbpass"]
    bad_files = [
        _server_file(stream_users={"app": {"pasword": "s3cret-pw"}}),
        _server_file(
            syncer_token="tok-ours",
            syncer_peers=[
                {"server_id": 2, "address": "tcp+sbs://127.0.0.1:1", "syncer_token": "tok-theirs"}
            ],
        ),
        _server_file(syncer_token="tok-ours", stream_users={"app": {"password_hash": "s3cret-pw"}}),
    ]
    for data in bad_files:
        with pytest.raises(ConfigError) as caught:
            load_stream_server_config(data)
        assert not [s for s in secrets if s in str(caught.value)], str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        "database: {url: 'oracle://app:dbpass@db/app'}\n",
        "database: {url: 'sqlite:/app:dbpass@x'}\n",  # too malformed to find the password in
        "database: {url: 'sqlite://app:dbpass@h:port/db'}\n",
        "- s3cret-pw\n- dbpass\n",  # not a mapping: the content is not shown
    ],
)
def test_config_check_of_a_bad_file_never_shows_its_passwords(
    tmp_path: Path, text: str, forgotten_secrets: None
) -> None:
    result = runner.invoke(app, ["config", "check", "-c", str(_write(tmp_path, text))])
    assert result.exit_code == 2, result.output
    assert "dbpass" not in result.output and "s3cret-pw" not in result.output, result.output
