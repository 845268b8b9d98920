"""The command line in production (issue 11, item 7): which configuration a command uses,
``tidings config check`` / ``schema``, and one clear line (exit code 2, no traceback) for
bad input and a bad environment: an unreachable database, a port out of range or in use.

Most tests run the commands through typer's CliRunner, which invokes the same command group
as the console script; one runs the real ``python -m tidings.cli`` to see stderr as a shell
does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from tests.support.certificates import TlsSetup
from tests.support.helpers import relay_config, write_config
from tidings.cli import app
from tidings.config.passwords import hash_password

runner = CliRunner()
UNREACHABLE = "postgresql+psycopg://app:pw@127.0.0.1:1/x"  # nothing listens on port 1
#: How an error shows it: the driver named, the password hidden.
SHOWN = "postgresql+psycopg://app:***@127.0.0.1:1/x"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _one_error_line(result: Result, needle: str) -> str:
    """The single stderr line of a failed command, checked: exit 2, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    return lines[0]


def _unreachable_config(tmp_path: Path) -> Path:
    path = tmp_path / "pg.yaml"
    path.write_text(
        f"database: {{url: '{UNREACHABLE}'}}\n"
        "targets: {store: {kind: event_store, url: 'sqlite:///e.db'}}\n"
    )
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["routes", "list"],
        ["routes", "add", "A", "store"],
        ["routes", "remove", "A", "store"],
    ],
)
def test_an_unreachable_database_is_one_line(tmp_path: Path, command: list[str]) -> None:
    result = runner.invoke(app, [*command, "-c", str(_unreachable_config(tmp_path))])
    line = _one_error_line(result, f"database {SHOWN}: ")  # which database, password hidden
    assert "Connection refused" in line and "pw" not in line


def test_the_console_script_prints_one_line_on_stderr(tmp_path: Path) -> None:
    """The real process, as a shell or a systemd unit sees it."""
    done = subprocess.run(
        [sys.executable, "-m", "tidings.cli", "status", "-c", str(_unreachable_config(tmp_path))],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "40"},  # a narrow terminal must not wrap the line
        timeout=60,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"error: database {SHOWN}: connection failed")


def test_a_missing_named_file_is_an_error_never_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["status", "-c", "nowhere[1].yaml"])
    _one_error_line(result, "'nowhere[1].yaml': No such file or directory")
    monkeypatch.setenv("TIDINGS_CONFIG", str(tmp_path / "gone.yaml"))
    result = runner.invoke(app, ["status"])
    _one_error_line(result, "gone.yaml")
    assert not (tmp_path / "tidings.db").exists()


def test_tidings_config_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(relay_config(tmp_path), tmp_path / "elsewhere.yaml")
    monkeypatch.chdir(tmp_path / "..")
    monkeypatch.setenv("TIDINGS_CONFIG", str(path))
    result = runner.invoke(app, ["routes", "list"])
    assert result.exit_code == 0, result.output
    assert "Created -> store" in result.stdout and result.stderr == ""


def test_without_any_file_the_defaults_are_used_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TIDINGS_CONFIG", raising=False)
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == (
        "note: no configuration given (-c, $TIDINGS_CONFIG or ./tidings.yaml): using the "
        f"defaults (database sqlite:///{tmp_path}/tidings.db)"
    )
    (tmp_path / "tidings.yaml").write_text("database: {url: 'sqlite:///here.db'}\n")
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 0 and result.stderr == ""
    assert (tmp_path / "here.db").exists()  # ./tidings.yaml was the configuration


def test_config_check_prints_the_resolved_configuration_with_secrets_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "Pa55[w]:rd"
    monkeypatch.setenv("DB_PASSWORD", secret)
    monkeypatch.setenv("NATS_TOKEN", "tok-123456")
    path = tmp_path / "prod.yaml"
    path.write_text(
        "database:\n  url: postgresql+psycopg://app:${DB_PASSWORD}@db:5432/app\n"
        "targets:\n"
        "  js: {kind: jetstream, servers: ['nats://${NATS_TOKEN}@nats:4222'], stream: S,\n"
        "       subject_prefix: s}\n"
        "  files: {kind: event_store, url: 'sqlite:///events.db'}\n"
        "relay: {checkpoint_dir: ck}\n"
    )
    result = runner.invoke(app, ["config", "check", "-c", str(path)])
    assert result.exit_code == 0, result.output
    assert secret not in result.stdout and "tok-123456" not in result.stdout
    shown = yaml.safe_load(result.stdout)
    assert shown["database"]["url"] == "postgresql+psycopg://app:***@db:5432/app"
    assert shown["targets"]["js"]["servers"] == ["nats://***@nats:4222"]
    assert shown["relay"]["checkpoint_dir"] == str(tmp_path / "ck")  # resolved, as used
    assert shown["targets"]["files"]["url"] == f"sqlite:///{tmp_path}/events.db"
    assert shown["relay"]["partitions"] == 2  # defaults shown too


def test_secret_names_and_url_passwords_are_masked_whatever_the_section() -> None:
    from tidings.redaction import masked

    data = {
        "syncer_token": "abc",
        "stream_users": {"u": {"password_hash": "scrypt$x", "password_hash_env": "HASH_VAR"}},
        "targets": {"x": {"nkey_seed": "SUA...", "apiKey": "k", "tls_keyfile": "/k.pem"}},
        "servers": ["tls://user:pa%40ss@h:1", "nats://h:2"],
        "note": "the value hunter2 appears here",
    }
    assert masked(data, {"hunter2"}) == {
        "syncer_token": "***",
        "stream_users": {"u": {"password_hash": "***", "password_hash_env": "HASH_VAR"}},
        "targets": {"x": {"nkey_seed": "***", "apiKey": "***", "tls_keyfile": "/k.pem"}},
        "servers": ["tls://user:***@h:1", "nats://h:2"],
        "note": "the value *** appears here",
    }


def test_config_check_refuses_an_invalid_file_with_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("relay: {partitions: 0}\nmetrics: {port: 70000}\n")
    result = runner.invoke(app, ["config", "check", "-c", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "relay.partitions" in result.stderr and "metrics.port" in result.stderr
    assert result.stdout == ""


def test_config_check_names_an_unset_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DB_PASSWORD", raising=False)
    path = tmp_path / "prod.yaml"
    path.write_text("database:\n  url: postgresql://app:${DB_PASSWORD}@db/app\n")
    result = runner.invoke(app, ["config", "check", "-c", str(path)])
    _one_error_line(result, "database.url: environment variable DB_PASSWORD is not set")


def test_config_check_of_a_server_configuration(tmp_path: Path) -> None:
    result = runner.invoke(app, ["config", "check", "--conf", str(EXAMPLES / "server-a.yaml")])
    assert result.exit_code == 0, result.output
    shown = yaml.safe_load(result.stdout)
    assert shown["type"] == "event" and shown["syncer_token"] == "***"
    bad = tmp_path / "event.yaml"
    bad.write_text(
        "type: event\nbackend: {module: tidings.server.backends.sqlite, db_path: e.db}\n"
        "engine: {server_id: 1}\neventer_server: {address: 'tcp+sbs://127.0.0.1:70000'}\n"
    )
    result = runner.invoke(app, ["config", "check", "--conf", str(bad)])
    assert result.exit_code == 2 and "eventer_server.address" in result.stderr
    assert "Traceback" not in result.output


def test_config_check_finds_engine_modules_that_would_not_load(tmp_path: Path) -> None:
    """A hat module's entry its own schema refuses, a module that is not there: named with
    their place in ``engine.modules``, before any server starts. A good entry passes."""
    conf = tmp_path / "event.yaml"
    conf.write_text(
        "type: event\nbackend: {module: tidings.server.backends.sqlite, db_path: e.db}\n"
        "eventer_server: {address: 'tcp+sbs://127.0.0.1:23012'}\n"
        "engine:\n  server_id: 1\n  modules:\n"
        "    - {module: tests.support.hat_modules.react, subscriptions: [[a]], prefix: [b]}\n"
        "    - {module: tidings.demo.alerts, threshold: 10}\n"
        "    - {module: tests.support.hat_modules.react, subscriptions: [[a]]}\n"
        "    - {module: no.such.module}\n"
    )
    result = runner.invoke(app, ["config", "check", "--conf", str(conf)])
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, result.stderr
    assert errors[0].startswith("error: engine.modules.2: module 'tests.support.hat_modules.react'")
    assert "'prefix' is a required property" in errors[0]
    assert errors[1].startswith("error: engine.modules.3: module 'no.such.module': cannot import")


def test_config_schema_validates_the_example_configurations() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    result = runner.invoke(app, ["config", "schema"])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.stdout)
    kinds = schema["properties"]["targets"]["additionalProperties"]["discriminator"]["mapping"]
    assert set(kinds) >= {"event_store", "jetstream", "event_server"}
    jsonschema.validate({"targets": {"o": {"kind": "event_store"}}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"metrics": {"port": 70000}}, schema)
    server = json.loads(runner.invoke(app, ["config", "schema", "--server"]).stdout)
    examples = sorted(EXAMPLES.glob("*.yaml"))
    assert len(examples) >= 4
    for path in examples:  # event server files say type: event; the others are tidings'
        data = yaml.safe_load(path.read_text())
        jsonschema.validate(data, server if data.get("type") == "event" else schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"type": "event", "backend": {"module": "m"}, "monitor": {}}, server)


def test_a_port_out_of_range_or_in_use_is_one_line(tmp_path: Path) -> None:
    path = write_config(relay_config(tmp_path), tmp_path / "tidings.yaml")
    result = runner.invoke(app, ["relay", "-c", str(path), "--metrics-port", "70000"])
    assert result.exit_code == 2 and "--metrics-port" in result.output
    assert "Traceback" not in result.output
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = runner.invoke(app, ["relay", "-c", str(path), "--metrics-port", str(port)])
    _one_error_line(result, "ddress already in use")


def test_config_check_loads_the_tls_files_and_names_one_that_is_not_pem(tmp_path: Path) -> None:
    setup = TlsSetup(tmp_path / "pki")
    garbage = tmp_path / "pki" / "garbage.pem"
    garbage.write_text("not a certificate\n")
    server = {
        "type": "event",
        "backend": {"module": "tidings.server.backends.sqlite", "db_path": "e.db"},
        "engine": {"server_id": 1},
        "eventer_server": {
            "address": "ssl+sbs://127.0.0.1:23012",
            "tls": {
                "cert_file": "pki/tidings-test-server.crt",
                "key_file": "pki/tidings-test-server.key",
            },
            "identities": {"app": {"password_hash": hash_password("pw", n=2**4)}},
        },
        "syncer_server": {
            "address": "ssl+sbs://127.0.0.1:23013",
            "tls": {"cert_file": str(garbage), "key_file": str(setup.server.key)},
        },
    }
    path = tmp_path / "event.yaml"
    path.write_text(yaml.safe_dump(server))
    result = runner.invoke(app, ["config", "check", "--conf", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "syncer_server.tls: tls.cert_file" in result.stderr
    assert "garbage.pem" in result.stderr and "not a PEM certificate" in result.stderr
    assert "eventer_server.tls" not in result.stderr  # its files load
    shown = yaml.safe_load(result.stdout)
    assert shown["eventer_server"]["tls"]["cert_file"] == str(setup.server.cert)
    assert shown["eventer_server"]["identities"]["app"]["password_hash"] == "***"

    in_file = tmp_path / "tidings.yaml"
    in_file.write_text(
        yaml.safe_dump(
            {
                "targets": {
                    "remote": {
                        "kind": "event_server",
                        "address": "ssl+sbs://127.0.0.1:23012",
                        "tls": {"ca_file": str(garbage)},
                    }
                }
            }
        )
    )
    result = runner.invoke(app, ["config", "check", "-c", str(in_file)])
    assert result.exit_code == 2
    assert "targets.remote.tls: tls.ca_file" in result.stderr


def test_config_check_loads_the_intermediaries_tls_files_too(tmp_path: Path) -> None:
    """An intermediary's own certificate, its spatial publisher's CA and a tier's peer CA
    are loaded by the check as the parts will load them, each named by its key."""
    TlsSetup(tmp_path / "pki")
    garbage = tmp_path / "pki" / "garbage.pem"
    garbage.write_text("not a certificate\n")
    spatial = {"upstream": "wss://127.0.0.1:8200/", "world_lo": [0, 0], "world_hi": [9, 9]}
    path = tmp_path / "tidings.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "intermediary": {
                    "tls": {"cert_file": str(garbage), "key_file": str(garbage)},
                    "spatial": spatial | {"tls": {"ca_file": str(garbage)}},
                },
                "intermediary_tiers": {
                    "w": {
                        "members": ["127.0.0.1:8301"],
                        "spatial": spatial,
                        "tls": {"cert_file": "pki/tidings-test-server.crt",
                                "key_file": "pki/tidings-test-server.key"},
                        "peer_tls": {"ca_file": str(garbage)},
                    }
                },
            }
        )
    )  # fmt: skip
    result = runner.invoke(app, ["config", "check", "-c", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    for key in ("intermediary.tls:", "intermediary.spatial.tls:", "intermediary_tiers.w.peer_tls:"):
        assert key in result.stderr
    assert "intermediary_tiers.w.tls:" not in result.stderr  # its files load
