"""FTN18 streams without a server: the type map, FTN3 messages, parameter checks, passwords
and the configuration."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.stream_helpers import PASSWORD, PASSWORD_HASH, TYPES, USER, stream_server_config
from tidings.errors import ConfigError, StreamError
from tidings.events.model import EventId, PayloadKind, StoredEvent
from tidings.streams import ftn3
from tidings.streams.auth import Users, hash_password
from tidings.streams.config import load_stream_server_config
from tidings.streams.encoding import wire_event
from tidings.streams.interfaces import interface_of
from tidings.streams.typemap import patterns_overlap, type_map_from_config


def test_patterns_overlap_follows_hat_matching() -> None:
    assert patterns_overlap(("a", "b"), ("a", "b"))
    assert patterns_overlap(("a", "?"), ("a", "b"))
    assert patterns_overlap(("a", "*"), ("a",))  # '*' matches zero segments
    assert patterns_overlap(("?", "*"), ("x", "y", "z"))
    assert not patterns_overlap(("a", "b"), ("a", "c"))
    assert not patterns_overlap(("a",), ("a", "b"))
    assert not patterns_overlap(("a", "?"), ("a", "b", "c"))


def test_type_map_names_events_and_resolves_want() -> None:
    types = type_map_from_config(TYPES)
    assert types.name_of(("orders", "created")) == "ORDER"
    assert types.name_of(("audit", "x", "y")) == "AUDIT"
    assert types.name_of(("orders", "deleted")) is None
    assert types.wanted_patterns(["PAY", "NOPE"]) == [("payments", "done")]
    assert types.wanted_patterns([]) == []
    assert len(types.wanted_patterns(None)) == 3
    assert types.event_type_of("ORDER") == ("orders", "created")
    assert types.event_type_of("AUDIT") is None  # a pattern cannot be generated


@pytest.mark.parametrize(
    ("types", "message"),
    [
        ({"order": ["a"]}, "cannot be an FTN18 type"),
        ({"ORDER_CREATED_LONGER": ["a"]}, "cannot be an FTN18 type"),
        ({"A": ["x", "*"], "B": ["x", "y"]}, "types A and B collide"),
        ({"A": [["x", "?"]], "B": ["x", "y"]}, "collide"),
        ({"A": []}, "not an event type pattern"),
        ({"A": ["*", "x"]}, "only as the last segment"),
        ({"A": [""]}, "not an event type pattern"),
        ({}, "at least one type"),
    ],
)
def test_type_map_refuses_names_that_cannot_map_and_collisions(types: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        type_map_from_config(types)


def test_config_refuses_bad_streams_with_the_key_named(tmp_path) -> None:
    good = stream_server_config(f"sqlite:///{tmp_path}/x.db")
    assert load_stream_server_config(good).streams[0].type_map().names == ("ORDER", "PAY", "AUDIT")
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


def test_basic_authentication() -> None:
    users = Users({USER: PASSWORD_HASH})
    assert users.authenticate(f"{USER}:{PASSWORD}") == USER
    assert users.authenticate(f"{USER}:{PASSWORD}") == USER  # the remembered pair
    for sec, reason in [
        (f"{USER}:wrong", "Verification Failed"),
        (f"nobody:{PASSWORD}", "Verification Failed"),
        (None, "Anonymous"),
        ("no-colon", "basic"),
        (f"-hmac:{USER}:x", "basic"),
    ]:
        with pytest.raises(StreamError, match=reason) as caught:
            users.authenticate(sec)
        assert caught.value.name == "SecurityError"
    assert hash_password("x", n=2**4) != hash_password("x", n=2**4)  # salted
    with pytest.raises(ConfigError):
        hash_password("")


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        ({"f": "futoin.evt.poll:1.1:pollEvents", "p": {}, "x": 1}, "unknown request fields"),
        ({"f": "pollEvents"}, "f must be"),
        ({"f": 3}, "f must be"),
        ({"f": "futoin.evt.poll:1.1:pollEvents", "p": []}, "p must be"),
        ({"f": "futoin.evt.poll:1.1:pollEvents", "rid": "X1"}, "rid must be"),
    ],
)
def test_malformed_requests_are_invalid_requests(message: dict, fragment: str) -> None:
    with pytest.raises(StreamError, match=fragment) as caught:
        ftn3.parse_request(message)
    assert caught.value.name == "InvalidRequest"


def test_decode_refuses_what_is_not_a_json_object() -> None:
    for data in (b"{", b"[1]", b"\xff\xfe", b'"x"'):
        with pytest.raises(StreamError) as caught:
            ftn3.decode(data)
        assert caught.value.name == "InvalidRequest"


@pytest.mark.parametrize(
    ("function", "params", "name", "fragment"),
    [
        ("futoin.evt.nope:1.0:x", {}, "UnknownInterface", "futoin.evt.nope"),
        ("futoin.evt.poll:2.0:pollEvents", {}, "NotSupportedVersion", "major"),
        ("futoin.evt.poll:1.2:pollEvents", {}, "NotSupportedVersion", "newer"),
        ("futoin.evt.poll:1.1:dropAll", {}, "InvalidRequest", "Not implemented"),
        ("futoin.evt.poll:1.1:pollEvents", {}, "InvalidRequest", "Missing parameter: component"),
        ("futoin.evt.poll:1.1:pollEvents", {"component": "A", "x": 1}, "InvalidRequest", "Unknown"),
        ("futoin.evt.poll:1.0:pollEvents", {"component": "a-b"}, "InvalidRequest", "component"),
        (
            "futoin.evt.poll:1.1:pollEvents",
            {"component": "A", "last_id": 5},
            "InvalidRequest",
            "last_id",
        ),
        (
            "futoin.evt.poll:1.1:pollEvents",
            {"component": "A", "last_id": "05"},
            "InvalidRequest",
            "last_id",
        ),
        (
            "futoin.evt.poll:1.1:pollEvents",
            {"component": "A", "want": "ORDER"},
            "InvalidRequest",
            "want",
        ),
        (
            "futoin.evt.poll:1.1:pollEvents",
            {"component": "A", "want": ["order"]},
            "InvalidRequest",
            r"want\[0\]",
        ),
        (
            "futoin.evt.gen:1.1:addEvent",
            {"type": "ORDER"},
            "InvalidRequest",
            "Missing parameter: data",
        ),
        ("futoin.evt.gen:1.1:ping", {"echo": True}, "InvalidRequest", "echo"),
    ],
)
def test_interface_version_and_parameter_errors(
    function: str, params: dict, name: str, fragment: str
) -> None:
    with pytest.raises(StreamError, match=fragment) as caught:
        request = ftn3.parse_request({"f": function, "p": params})
        _, checked = interface_of(request)
        checked.check(request.params)
    assert caught.value.name == name


def test_older_minor_versions_are_served() -> None:
    request = ftn3.parse_request({"f": "futoin.evt.poll:1.0:pollEvents", "p": {"component": "A"}})
    _, function = interface_of(request)
    assert function.check(request.params) == {"component": "A", "last_id": None, "want": None}


def test_wire_events_are_valid_ftn18_whatever_the_payload() -> None:
    def event(payload: bytes | None, kind: PayloadKind | None) -> dict:
        stamp = 1_795_393_606_529_812
        stored = StoredEvent(7, EventId(1, 1, 1), ("a",), stamp, None, payload, kind, None)
        return json.loads(wire_event(stored, "A").encoded)

    assert event(b'{"x": [1, 2]}', PayloadKind.JSON) == {
        "id": "7",
        "type": "A",
        "data": {"x": [1, 2]},
        "ts": "2026-11-23T00:26:46Z",  # the second of FutoIn's traced event, no fraction
    }
    assert event(None, None)["data"] is None
    assert event(b"not json", PayloadKind.JSON)["data"] == "not json"
    assert event(b"NaN", PayloadKind.JSON)["data"] == "NaN"
    assert event(b"\x00\x01", PayloadKind.BINARY)["data"] == {
        "payload_kind": "binary",
        "base64": "AAE=",
    }


def test_aggregation_configuration_is_checked() -> None:
    from tidings.config import validate_config
    from tidings.streams.config import AggregateConfig

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

    from tidings.streams.config import load_stream_server_config_file

    monkeypatch.setenv("TIDINGS_APP_HASH", hash_password("s3cret", n=2**4))
    example = Path(__file__).resolve().parents[2] / "examples" / "server-streams.yaml"
    config = load_stream_server_config_file(example)
    [stream] = config.streams
    assert stream.type_map().event_type_of("ORDER_PLACED") == ("orders", "OrderPlaced")
    assert config.stream_users["app"].resolved_hash("app").startswith("scrypt$")


def test_tidings_server_refuses_bad_streams_before_it_starts(tmp_path) -> None:
    import subprocess
    import sys

    import yaml

    config = stream_server_config(f"sqlite:///{tmp_path}/e.db")
    config["stream_users"] = {USER: {"password_hash_env": "TIDINGS_TEST_UNSET_HASH"}}
    path = tmp_path / "server.yaml"
    for mutate, message in [
        (lambda c: None, "TIDINGS_TEST_UNSET_HASH is not set"),
        (lambda c: c["streams"][0]["types"].update({"LOW": [["orders", "*"]]}), "collide"),
    ]:
        mutate(config)
        path.write_text(yaml.safe_dump(config))
        done = subprocess.run(
            [sys.executable, "-m", "tidings.cli", "server", "--conf", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if k != "TIDINGS_TEST_UNSET_HASH"},
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert not (tmp_path / "e.db").exists()  # refused before the store was opened


def test_stream_sockets_ask_for_tcp_nodelay() -> None:
    """asyncio sets TCP_NODELAY on accepted connections only when the listening socket says
    it is TCP; without it each reply on a kept-alive HTTP connection waited ~40 ms."""
    import socket

    from tidings.serving import listen

    sock = listen("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        sock.close()
