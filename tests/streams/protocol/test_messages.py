"""FTN3 messages, the FTN18 interfaces' parameter checks and events on the wire, without a
server."""

from __future__ import annotations

import json

import pytest

from tidings.errors import StreamError
from tidings.events.model import EventId, PayloadKind, StoredEvent
from tidings.streams.protocol import ftn3
from tidings.streams.protocol.encoding import wire_event
from tidings.streams.protocol.interfaces import interface_of


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
