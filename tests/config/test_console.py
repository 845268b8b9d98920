"""The ``console:`` section: safe defaults, and what it refuses with a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidings.config import load_config
from tidings.config.passwords import hash_password
from tidings.errors import ConfigError
from tidings.system.parts import parts_of

HASH = hash_password("pw", n=2**4)


def _console(**section: object) -> dict:
    return {"console": {"users": {"ops": {"password_hash": HASH}}, **section}}


def test_the_defaults_are_loopback_read_only_and_a_file_beside_the_config() -> None:
    config = load_config(_console())
    assert config.console is not None
    assert (config.console.host, config.console.port) == ("127.0.0.1", 8480)
    assert config.console.users["ops"].role == "read"
    assert config.console.url == "http://127.0.0.1:8480/"
    assert load_config({}).console is None


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ({"host": "0.0.0.0"}, "not a loopback address: set tls"),
        ({"users": {}}, "users"),
        ({"users": {"ops": {}}}, "needs password_hash or password_hash_env"),
        ({"users": {"ops": {"password": "pw"}}}, "clear passwords are not accepted"),
        ({"users": {"ops": {"password_hash": HASH, "role": "admin"}}}, "role"),
        ({"sample_every": "0s"}, "sample_every"),
        ({"history": "2s", "sample_every": "5s"}, "history must be at least sample_every"),
        ({"page_size": 0}, "page_size"),
    ],
)
def test_a_bad_console_section_is_refused_by_name(section: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(_console(**section))


def test_a_clear_password_is_not_echoed_in_the_error() -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(_console(users={"ops": {"password": "hunter2-secret"}}))
    assert "hunter2-secret" not in str(raised.value)


def test_a_remote_console_needs_tls_or_a_stated_proxy(tls_files: dict[str, str]) -> None:
    tls = {"cert_file": tls_files["server.pem"], "key_file": tls_files["server.key"]}
    assert load_config(_console(host="0.0.0.0", tls=tls)).console.url.startswith("https://")  # type: ignore[union-attr]
    assert load_config(_console(host="0.0.0.0", plain_http_remote=True)).console is not None


def test_tidings_run_runs_the_console_as_a_part(tmp_path: Path) -> None:
    config = load_config(_console(port=8999))
    path = tmp_path / "tidings.yaml"
    (part,) = parts_of(config, path)
    assert (part.name, part.kind, part.ready_on) == ("console", "console", ("127.0.0.1", 8999))
    assert part.command[3:] == ("console", "-c", str(path))
