"""Configuration: one validated model, errors that name the key and the value."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.helpers import assert_unreadable_files_fail
from tidings.config import load_config, load_config_file, parse_duration
from tidings.db import make_engine
from tidings.errors import ConfigError
from tidings.pipeline.jobconfig import job_config, job_options
from tidings.routing.table import table_routes


def test_defaults_are_the_embedded_setup() -> None:
    config = load_config({})
    assert config.database.url.startswith("sqlite:///")
    assert config.relay.spark_master == "local[*]"
    retry = config.relay.retry
    assert (retry.attempts, retry.backoff, retry.max_backoff) == (None, None, timedelta(seconds=30))
    assert config.outbox.max_payload_bytes == 1024 * 1024


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"relay": {"partitions": 0}}, "relay.partitions"),
        ({"relay": {"trigger_interval": "soon"}}, "'soon'"),
        ({"relay": {"retry": {"backoff": "10ms"}}}, "relay.retry.backoff"),
        ({"relay": {"retry_backoff": ["10ms"]}}, "now relay.retry.backoff"),
        ({"relay": {"retry": {"backoff": ["1s"], "attempts": 3}}}, "not both"),
        ({"relay": {"retry": {"jitter": 1.5}}}, "relay.retry.jitter"),
        ({"relay": {"retry": {"attempts": 0}}}, "relay.retry.attempts"),
        ({"relay": {"driver_java_options": "-Xmx2g -Dx=1"}}, "with relay.driver_memory"),
        ({"relay": {"retry": {"attempts": 30}}}, "over replay.retry_count_threshold (20)"),
        ({"databse": {"url": "x"}}, "databse: unknown key"),
        ({"database": {"url": "oracle://x"}}, "oracle://x"),
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
    config = load_config({"relay": {"retry": {"backoff": ["10ms", "2s"]}, "replay_every": "30m"}})
    again = type(config).model_validate_json(config.model_dump_json())
    assert again == config


def test_config_file_errors(tmp_path: Path) -> None:
    assert_unreadable_files_fail(
        load_config_file, tmp_path, missing="cannot read", not_yaml="relay: [unclosed\n"
    )
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("relay:\n  max_events_per_batch: -5\n")
    with pytest.raises(ConfigError, match=r"relay\.max_events_per_batch.*-5"):
        load_config_file(wrong)


# -- relative paths ---------------------------------------------------------------------------

RELATIVE = """
database: {url: "sqlite:///data/app.db?timeout=5"}
targets:
  store: {kind: event_store, url: "sqlite:///events.db", fault_file: faults/store}
  js: {kind: jetstream, stream: S, subject_prefix: s, fault_file: ../js.fault}
  remote: {kind: event_server, fault_file: "~/remote.fault"}
  pg: {kind: event_store, url: "postgresql://app@db/app"}
  mem: {kind: event_store, url: "sqlite://"}
routing: {routes: {Created: [store]}}
relay: {checkpoint_dir: .tidings/checkpoint}
housekeeping: {archive_dir: "s3a://bucket/archive"}
"""


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory that is not the configuration file's."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_relative_paths_in_a_file_are_relative_to_the_file(tmp_path: Path, elsewhere: Path) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "tidings.yaml").write_text(RELATIVE)
    config = load_config_file(Path("..") / "conf" / "tidings.yaml")  # a relative path, too
    targets = config.targets
    assert config.database.url == f"sqlite:///{conf_dir}/data/app.db?timeout=5"
    assert targets["store"].url == f"sqlite:///{conf_dir}/events.db"
    assert targets["store"].fault_file == f"{conf_dir}/faults/store"
    assert targets["js"].fault_file == f"{conf_dir}/../js.fault"
    assert targets["remote"].fault_file == str(Path.home() / "remote.fault")
    assert targets["pg"].url == "postgresql://app@db/app"  # not a file: as written
    assert targets["mem"].url == "sqlite://"  # in memory: as written
    assert config.relay.checkpoint_dir == f"{conf_dir}/.tidings/checkpoint"
    assert config.housekeeping.archive_dir == "s3a://bucket/archive"  # a URI: as written


def test_defaults_left_out_of_a_file_lie_beside_it(tmp_path: Path, elsewhere: Path) -> None:
    path = tmp_path / "tidings.yaml"
    path.write_text("targets: {store: {kind: event_store}}\n")
    config = load_config_file(path)
    assert config.database.url == f"sqlite:///{tmp_path}/tidings.db"
    assert config.targets["store"].url == f"sqlite:///{tmp_path}/tidings-events.db"
    assert config.relay.checkpoint_dir == f"{tmp_path}/.tidings/checkpoint"
    assert config.housekeeping.archive_dir == f"{tmp_path}/.tidings/archive"


def test_absolute_paths_and_mappings_without_a_file_stay_as_given(
    tmp_path: Path, elsewhere: Path
) -> None:
    path = tmp_path / "tidings.yaml"
    path.write_text(f"relay: {{checkpoint_dir: {tmp_path / 'cp'}}}\n")
    assert load_config_file(path).relay.checkpoint_dir == str(tmp_path / "cp")
    config = load_config(yaml.safe_load(RELATIVE))
    assert config.database.url == "sqlite:///data/app.db?timeout=5"
    assert config.relay.checkpoint_dir == ".tidings/checkpoint"
    assert config.targets["store"].fault_file == "faults/store"


def test_resolved_paths_travel_to_spark_tasks_and_routing_still_reloads(
    tmp_path: Path, elsewhere: Path
) -> None:
    """Tasks get the configuration as JSON (absolute paths now) and re-read only routing."""
    path = tmp_path / "tidings.yaml"
    path.write_text(RELATIVE)
    config = load_config_file(path)
    options = job_options(config, str(path))
    assert job_config(options) == config
    path.write_text(RELATIVE.replace("Created: [store]", "Created: [store, js]"))
    stamp = path.stat().st_mtime + 1
    os.utime(path, (stamp, stamp))
    reloaded = job_config(options)
    assert reloaded.routing.routes == {"Created": ["store", "js"]}
    assert reloaded.relay.checkpoint_dir == f"{tmp_path}/.tidings/checkpoint"


def test_the_cli_run_from_another_directory_writes_beside_the_config(tmp_path: Path) -> None:
    """A real ``tidings`` process: the database of a relative SQLite URL lands by the file."""
    conf_dir, cwd = tmp_path / "conf", tmp_path / "elsewhere"
    conf_dir.mkdir()
    cwd.mkdir()
    (conf_dir / "tidings.yaml").write_text(
        "database: {url: 'sqlite:///app.db'}\n"
        "targets: {store: {kind: event_store, url: 'sqlite:///events.db'}}\n"
    )
    command = [sys.executable, "-m", "tidings.cli", "routes", "add", "Created", "store"]
    done = subprocess.run(
        [*command, "-c", "../conf/tidings.yaml"], cwd=cwd, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert (conf_dir / "app.db").is_file()
    assert list(cwd.iterdir()) == []
    engine = make_engine(f"sqlite:///{conf_dir / 'app.db'}")
    assert table_routes(engine) == {"Created": ["store"]}
    engine.dispose()


# --- ${VAR} substitution, TIDINGS_CONFIG, the JSON Schema (issue 11, item 7) ----------------


def _file(tmp_path: Path, text: str, name: str = "tidings.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_variables_are_substituted_in_values_with_defaults_and_escapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DB_PASSWORD", 's3"cr#t\nx: y')  # YAML syntax in a secret stays data
    monkeypatch.setenv("METRICS_PORT", "9108")
    monkeypatch.setenv("EMPTY", "")
    monkeypatch.delenv("ORIGINATOR", raising=False)
    path = _file(
        tmp_path,
        'database: {url: "postgresql://app:${DB_PASSWORD}@db/app"}\n'
        "metrics:\n  port: ${METRICS_PORT}\n"  # unquoted works in block style
        "outbox: {originator: '${ORIGINATOR:-billing}-${EMPTY:-svc}'}\n"
        "relay: {spark_master: '$${NOT_A_VAR} and $$'}\n",
    )
    config = load_config_file(path)
    assert config.database.url == 'postgresql://app:s3"cr#t\nx: y@db/app'
    assert config.metrics.port == 9108  # a wholly substituted value is converted as a scalar
    assert config.outbox.originator == "billing-svc"  # :- also covers an empty variable
    assert config.relay.spark_master == "${NOT_A_VAR} and $$"


def test_an_unset_variable_without_default_names_it_and_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIDINGS_TEST_UNSET", raising=False)
    path = _file(tmp_path, "relay:\n  retry:\n    backoff: [10ms, '${TIDINGS_TEST_UNSET}']\n")
    with pytest.raises(ConfigError) as caught:
        load_config_file(path)
    message = str(caught.value)
    assert "relay.retry.backoff[1]" in message and "TIDINGS_TEST_UNSET is not set" in message
    assert str(path) in message


def test_a_malformed_reference_is_an_error_not_kept(tmp_path: Path) -> None:
    path = _file(tmp_path, "outbox: {originator: '${not a name}'}\n")
    with pytest.raises(ConfigError, match=r"outbox.originator: \$\{not a name\} is not a variable"):
        load_config_file(path)


def test_the_event_server_configuration_is_substituted_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidings.config.server import load_server_config_file

    monkeypatch.setenv("SYNC_TOKEN", "t0ken")
    path = _file(
        tmp_path,
        "type: event\nbackend: {module: tidings.server.backends.sqlite, db_path: e.db}\n"
        "engine: {server_id: 1}\nsyncer_token: ${SYNC_TOKEN}\n",
        "event.yaml",
    )
    assert load_server_config_file(path).syncer_token == "t0ken"


def test_the_file_to_use_named_found_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidings.config import find_config_file

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TIDINGS_CONFIG", raising=False)
    assert find_config_file(None) is None
    _file(tmp_path, "{}\n")
    assert find_config_file(None) == Path("tidings.yaml")
    monkeypatch.setenv("TIDINGS_CONFIG", str(tmp_path / "missing.yaml"))
    assert find_config_file(None) == tmp_path / "missing.yaml"  # named: never a fallback
    assert find_config_file("other.yaml") == Path("other.yaml")


def _relay_guide_tidings_yaml() -> dict:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "relay.md").read_text()
    block = guide.split("Example `tidings.yaml`:", 1)[1].split("```yaml", 1)[1].split("```")[0]
    return yaml.safe_load(block)


def test_the_json_schema_accepts_the_relay_guide_example_and_refuses_what_loading_refuses() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from tidings.config import config_json_schema

    schema = config_json_schema()
    example = _relay_guide_tidings_yaml()
    load_config(example)  # the example is a valid configuration ...
    jsonschema.validate(example, schema)  # ... and the schema says so
    jsonschema.validate({"relay": {"retry": {"backoff": ["10ms", 0.5, "PT1S"]}}}, schema)
    for bad in (
        {"databse": {}},
        {"targets": {"t": {"kind": "kafka"}}},
        {"targets": {"t": {"kind": "jetstream", "stream": "S", "subject_prefix": "s", "x": 1}}},
        {"relay": {"partitions": 0}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
        with pytest.raises(ConfigError):
            load_config(bad)


def _group(retention: dict[str, Any], **target: Any) -> dict[str, Any]:
    """A file with servers a and b (a stream each with ``retention``) and an
    ``event_server`` target ``relay_to`` publishing to both (``target`` keys added)."""

    def server(server_id: int, port: int, monitor: bool) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "backend": {"module": "tidings.server.backends.sqlite", "db_path": f"{server_id}.db"},
            "engine": {"server_id": server_id},
            "eventer_server": {"address": f"tcp+sbs://127.0.0.1:{port}"},
            "stream_users": {"u": {"password_hash_env": "H"}},
            "streams": [
                {"name": "s", "port": port + 100, "types": {"A": ["a"]}, "retention": retention}
            ],
        }
        if monitor:
            entry["monitor"] = {
                "name": f"s{server_id}",
                "group": "event",
                "monitor_address": "tcp+sbs://127.0.0.1:23010",
            }
        return entry

    monitor = "monitor" in target
    return {
        "servers": {"a": server(1, 23012, monitor), "b": server(2, 23022, monitor)},
        "targets": {
            "relay_to": {
                "kind": "event_server",
                **({} if monitor else {"addresses": ["tcp+sbs://127.0.0.1:23022"]}),
                **target,
            }
        },
    }


@pytest.mark.parametrize(
    ("target", "server"),
    [
        ({}, "b"),  # its address
        (
            {"monitor": {"monitor_address": "tcp+sbs://127.0.0.1:23010", "server_group": "event"}},
            "a",
        ),
    ],
    ids=["addresses", "monitor"],
)
def test_a_retention_shorter_than_the_relays_resend_window_is_refused(
    target: dict, server: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(_group({"enabled": True, "min_age": "5s"}, **target))
    assert str(refused.value).startswith(
        f"servers.{server}.streams[0].retention.min_age (5s) is shorter than "
        "targets.relay_to.failover_resend (10s): "
    )


def test_a_server_log_retention_shorter_than_the_resend_window_is_refused() -> None:
    config = _group({"enabled": False})
    rules = [{"subscriptions": [["a"]], "max_entries": 10}]
    config["servers"]["b"]["retention"] = {"rules": rules, "min_age": "5s"}
    with pytest.raises(ConfigError) as refused:
        load_config(config)
    assert str(refused.value).startswith(
        "servers.b.retention.min_age (5s) is shorter than targets.relay_to.failover_resend (10s): "
    )
    config["servers"]["b"]["retention"]["min_age"] = "10s"
    load_config(config)


@pytest.mark.parametrize(
    ("retention", "target"),
    [
        ({"enabled": True, "min_age": "10s"}, {}),  # as long as the window
        ({"enabled": False, "min_age": "0s"}, {}),  # no retention
        ({"enabled": True, "min_age": "5s"}, {"failover_resend": "0s"}),  # nothing sent again
        ({"enabled": True, "min_age": "5s"}, {"failover_resend": "5s"}),
        # a server the target does not publish to (a only; b is where it publishes)
        ({"enabled": True, "min_age": "5s"}, {"addresses": ["tcp+sbs://127.0.0.1:23032"]}),
    ],
)
def test_a_retention_the_resend_window_fits_in_is_accepted(retention: dict, target: dict) -> None:
    load_config(_group(retention, **target))


@pytest.mark.parametrize(
    "url", ["mysql://app@db/app", "mariadb://app@db/app", "mysql+pymysql://app@db/app"]
)
def test_mysql_and_mariadb_urls_are_outbox_databases(url: str) -> None:
    assert load_config({"database": {"url": url}}).database.url == url
