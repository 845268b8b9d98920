"""The hat-event 0.8.5 wire: SBS codec round trips (checked against hat-event's own codec),
chatter framing, addresses, conversations, pings and bad input on a socket pair."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from dataclasses import replace
from typing import Any

import hat.event.common as hat_common
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.harness.processes import local_address
from tests.support.server_helpers import (
    event_to_sbs,
    length_prefixed,
    raw_frame,
    raw_message,
    read_raw_frame,
    socket_pair,
    wait_peer_closed,
    warnings_of,
)
from tests.support.waiting import run, until
from tidings.address import parse_address, parse_endpoint
from tidings.errors import ConfigError, ConnectionClosed, ProtocolError, StoreError
from tidings.events.model import EventId, NewEvent, PayloadKind, StoredEvent
from tidings.events.query import QueryData
from tidings.wire import (
    chatter,
    chatter_client,
    chatter_server,
    codec,
    envelope,
    frame_reader,
    prescan,
)
from tidings.wire.chatter import Connection

# --- codec ----------------------------------------------------------------------------------

SBS_PAYLOAD = codec.encode("Hat", "Data", {"module": ("value", "M"), "type": "T", "data": b"\x01"})
SBS_PAYLOAD_NO_MODULE = codec.encode(
    "Hat", "Data", {"module": ("none", None), "type": "T", "data": b""}
)

EVENTS = [
    StoredEvent(0, EventId(1, 2, 3), ("a", "b"), 1_700_000_000_123_456, None, None, None, None),
    StoredEvent(0, EventId(1, 2, 4), ("a",), 0, -1, b"\x00\xff", PayloadKind.BINARY, None),
    StoredEvent(
        0,
        EventId(7, 1, 1),
        ("x", "y", "z"),
        -1_500_000,
        5,
        b'{"x": [1, 2]}',
        PayloadKind.JSON,
        None,
    ),
    StoredEvent(0, EventId(1, 9, 9), ("s",), 1, 2, SBS_PAYLOAD, PayloadKind.SBS, None),
    StoredEvent(0, EventId(1, 9, 10), ("s",), 1, 2, SBS_PAYLOAD_NO_MODULE, PayloadKind.SBS, None),
    StoredEvent(
        0, EventId(1, 9, 11), ("u", "é"), 1, None, '"ünï"'.encode(), PayloadKind.JSON, None
    ),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: "/".join(e.type))
def test_event_round_trip(event: StoredEvent) -> None:
    wire = codec.encode_event(event)
    assert wire == codec.encode("HatEventer", "Event", event_to_sbs(event))
    assert codec.event_from_sbs(codec.decode("HatEventer", "Event", wire)) == event


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: "/".join(e.type))
def test_event_encoding_matches_hat_event(event: StoredEvent) -> None:
    """hat-event 0.8.5 decodes our bytes to the same event, and encodes it to the same bytes."""
    wire = codec.encode_event(event)
    hat_event = hat_common.event_from_sbs(hat_common.sbs_repo.decode("HatEventer", "Event", wire))
    assert hat_event.event_id == hat_common.EventId(*vars_of(event.id))
    assert hat_event.event_type == event.type
    seconds, micros = divmod(event.timestamp_us, 1_000_000)
    assert hat_event.timestamp == hat_common.Timestamp(seconds, micros)
    if event.payload_kind is PayloadKind.JSON:
        # hat-event parses JSON text and writes it back in its own style (ASCII escapes).
        assert hat_event.payload.data == json.loads(event.payload or b"")
        return
    again = hat_common.sbs_repo.encode("HatEventer", "Event", hat_common.event_to_sbs(hat_event))
    assert again == wire


def vars_of(event_id: EventId) -> tuple[int, int, int]:
    return event_id.server, event_id.session, event_id.instance


@pytest.mark.parametrize(
    ("us", "wire"),
    [
        (0, {"s": 0, "us": 0}),
        (1_500_000, {"s": 1, "us": 500_000}),
        (-1, {"s": -1, "us": 999_999}),
        (-1_000_000, {"s": -1, "us": 0}),
        (-2_500_001, {"s": -3, "us": 499_999}),
    ],
)
def test_timestamps_keep_us_in_range(us: int, wire: dict[str, int]) -> None:
    assert codec.timestamp_to_sbs(us) == wire
    assert codec.timestamp_from_sbs(wire, "t") == us
    hat_ts = hat_common.timestamp_from_sbs(wire)
    assert hat_common.timestamp_to_sbs(hat_ts) == wire


@pytest.mark.parametrize("wire", [{"s": 0, "us": 1_000_000}, {"s": 0, "us": -1}])
def test_invalid_timestamp_is_a_protocol_error(wire: dict[str, Any]) -> None:
    """The SBS decoder guarantees integers; the microsecond range is ours to check."""
    with pytest.raises(ProtocolError, match="invalid timestamp"):
        codec.timestamp_from_sbs(wire, "t")


@pytest.mark.parametrize(
    "new_event",
    [
        NewEvent(("a",)),
        NewEvent(("a", "b"), b"raw", PayloadKind.BINARY, -5),
        NewEvent(("a",), b"null", PayloadKind.JSON, 0),
        NewEvent(("a",), SBS_PAYLOAD, PayloadKind.SBS),
    ],
)
def test_register_event_round_trip(new_event: NewEvent) -> None:
    wire = codec.encode("HatEventer", "RegisterEvent", codec.register_event_to_sbs(new_event))
    decoded = codec.decode("HatEventer", "RegisterEvent", wire)
    assert codec.register_event_from_sbs(decoded) == new_event
    with_outbox = codec.register_event_from_sbs(decoded, outbox_event_id="o-1")
    assert with_outbox.outbox_event_id == "o-1"


@pytest.mark.parametrize("text", ["{nope", "", "   ", "1 2", '{"a": 1} x', "[1,]", "NaN x"])
def test_json_payload_must_be_json_text(text: str) -> None:
    with pytest.raises(ProtocolError, match="not valid JSON"):
        codec.payload_from_sbs(("json", text), "payload")


@pytest.mark.parametrize("text", ['{"a": 1}', ' \n{"a": [1, 2]}\t ', "null", '"s"', "-1.5e3"])
def test_json_payload_is_kept_as_sent(text: str) -> None:
    assert codec.payload_from_sbs(("json", text), "p") == (PayloadKind.JSON, text.encode())


def test_json_payload_from_hat_event_is_stored_unchanged() -> None:
    hat_payload = hat_common.EventPayload(hat_common.EventPayloadType.JSON, {"x": [1, "ü"]})
    kind, data = codec.payload_from_sbs(hat_common.event_payload_to_sbs(hat_payload), "p")
    assert kind is PayloadKind.JSON
    assert json.loads(data) == {"x": [1, "ü"]}


def test_register_results_round_trip() -> None:
    results = [EVENTS[0], None, EVENTS[2]]
    wire = codec.encode_register_results(results)
    decoded = codec.register_results_from_sbs(codec.decode("HatEventer", "MsgRegisterRes", wire))
    assert decoded == results


FULL_QUERY = QueryData(
    server_id=3,
    event_ids=(EventId(1, 2, 3), EventId(3, 1, 1)),
    event_types=(("a", "?", "c"), ("b", "*"), ("*",)),
    t_from=-1,
    t_to=2_000_000,
    source_t_from=-3_000_001,
    source_t_to=7,
    payload=(PayloadKind.BINARY, b"\x00"),
    order="ascending",
    order_by="source_timestamp",
    unique_type=True,
    max_results=10,
)


@pytest.mark.parametrize(
    "query",
    [
        QueryData(),
        FULL_QUERY,
        QueryData(payload=(PayloadKind.JSON, b"[1]"), max_results=0),
        QueryData(payload=(PayloadKind.SBS, SBS_PAYLOAD), order_by="timestamp"),
    ],
    ids=["default", "full", "json", "sbs"],
)
def test_query_round_trip(query: QueryData) -> None:
    wire = codec.encode("HatEventer", "QueryData", codec.query_to_sbs(query))
    assert codec.query_from_sbs(codec.decode("HatEventer", "QueryData", wire)) == query


def test_query_matches_hat_event() -> None:
    wire = codec.encode("HatEventer", "QueryData", codec.query_to_sbs(FULL_QUERY))
    hat_query = hat_common.query_from_sbs(
        hat_common.sbs_repo.decode("HatEventer", "QueryData", wire)
    )
    assert hat_query.server_id == 3
    assert hat_query.event_types == [("a", "?", "c"), ("b", "*"), ("*",)]
    assert hat_query.t_from == hat_common.Timestamp(-1, 999_999)
    assert hat_query.order is hat_common.Order.ASCENDING
    assert hat_query.order_by is hat_common.OrderBy.SOURCE_TIMESTAMP
    assert hat_query.unique_type is True
    assert hat_query.max_results == 10
    # And hat-event's default query is ours.
    default = hat_common.sbs_repo.encode(
        "HatEventer", "QueryData", hat_common.query_to_sbs(hat_common.QueryData())
    )
    assert codec.query_from_sbs(codec.decode("HatEventer", "QueryData", default)) == QueryData()


def test_invalid_query_is_refused_by_the_query_model() -> None:
    value = codec.query_to_sbs(QueryData())
    value["types"] = ("value", [["*", "x"]])
    with pytest.raises(StoreError, match="only as the last segment"):
        codec.query_from_sbs(value)


@pytest.mark.parametrize("data", [b"", b"\x85", b"\xff", b"\x81\x82\x83raw\x81x\x80\x81\x85hi"])
def test_undecodable_sbs_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError, match="undecodable SBS"):
        codec.decode("HatEventer", "MsgRegisterReq", data)


# --- bounded decoding (the pre-scan) --------------------------------------------------------

REGISTER_ITEM = codec.register_event_to_sbs(NewEvent(("a", "b"), b'{"n": 1}', PayloadKind.JSON, 5))


@pytest.mark.parametrize("count", [2**31, 2**62])
def test_a_lying_array_count_is_refused_before_decoding(count: int) -> None:
    """A count whose items cannot fit in the bytes left is refused at the count itself (the C
    decoder would first allocate a list of that many slots)."""
    body = codec.encode_integer(count) + b"\x80"
    with pytest.raises(ProtocolError, match=f"array of {count} items at byte .* needs at least"):
        codec.decode("HatEventer", "MsgRegisterReq", body)


def test_a_lying_byte_length_is_refused() -> None:
    body = codec.encode_integer(1) + codec.encode_integer(1) + codec.encode_integer(2**40) + b"x"
    with pytest.raises(
        ProtocolError, match="length 1099511627776 at byte 2 exceeds the 1 bytes left"
    ):
        codec.decode("HatEventer", "MsgSubscribe", body)


def test_a_message_of_many_tiny_values_is_refused_at_its_count() -> None:
    """Each item is one byte (an empty type), so the count is honest, but 4 Mi items are over
    the budget of values of a 4 MiB message (one per two bytes)."""
    items = 4 * 1024 * 1024
    body = codec.encode_integer(items) + b"\x80" * items
    with pytest.raises(ProtocolError, match="exceeds the message's budget of values"):
        codec.decode("HatEventer", "MsgSubscribe", body)
    with pytest.raises(ProtocolError, match="exceeds the message's budget of values"):
        codec.decode_in_slices("HatEventer", "MsgSubscribe", body, 64 * 1024)


def test_nested_values_over_the_budget_are_refused_during_the_walk() -> None:
    """Honest counts at every level, over budget only in total: refused by the walk."""
    types = [[""] * 60] * 20_000  # 1.22 M values (empty strings: one byte each) in 1.22 MB
    body = codec.encode("HatEventer", "MsgSubscribe", types)
    assert prescan.value_budget(len(body)) < 1_200_000
    with pytest.raises(ProtocolError, match="budget of values"):
        codec.decode("HatEventer", "MsgSubscribe", body)
    assert codec.SCHEMAS.check("HatEventer", "MsgSubscribe", body, budget=1_300_000) is None


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"\x01" * 10 + b"\x81", "longer than 64 bits"),
        (b"\x81" + b"\x81" + b"\x83x", "length 3 at byte 2 exceeds the 1 bytes left"),
        (b"\x81" + b"\x81" + b"\x01", "integer at byte 2 runs past the end"),
        (codec.encode("HatEventer", "MsgSubscribe", [["a"]]) + b"\x00", "1 bytes after"),
    ],
)
def test_other_malformed_bytes_are_refused_by_the_pre_scan(body: bytes, problem: str) -> None:
    with pytest.raises(ProtocolError, match=f"HatEventer.MsgSubscribe: undecodable SBS.*{problem}"):
        codec.decode("HatEventer", "MsgSubscribe", body)


def test_an_integer_of_ten_bytes_beyond_64_bits_is_refused() -> None:
    """Ten bytes hold 70 bits; hat-sbs's decoder would wrap such a value silently."""
    too_big = codec.encode_integer(2**66 + 1)
    assert len(too_big) == 10
    with pytest.raises(ProtocolError, match="longer than 64 bits"):
        codec.decode("HatSyncer", "MsgReq", too_big + b"\x81" * 3 + b"\x80")
    with pytest.raises(ProtocolError, match="longer than 64 bits"):
        envelope.parse(too_big + b"\x81\x01\x01\x00\x80\x81a\x80")
    for edge in (2**63 - 1, -(2**63)):
        assert prescan.read_integer(codec.encode_integer(edge), 0, 10)[0] == edge


def test_what_servers_send_decodes_however_dense_it_is() -> None:
    """Payload-less events are 13 values in 21 bytes: 100,000 of them (1.3 M values in 2.1 MB,
    over a budget per byte) are a reply, a notification or a sync a client must read. They
    decode whole and in slices, as hat-sbs decodes them; a server reading the same bytes
    (anyone may send it any type) holds them to its budget."""
    events = [
        StoredEvent(
            0, EventId(1, 3, 100_000 + n), ("a", "b"), 1_700_000_000 * 10**6 + n, *[None] * 4
        )
        for n in range(100_000)
    ]
    body = codec.encode_events(events)
    assert prescan.value_budget(len(body)) < 1_300_000
    for module, type_name in [
        ("HatEventer", "MsgQueryRes"),
        ("HatEventer", "MsgNotify"),
        ("HatSyncer", "MsgEvents"),
    ]:
        expected = codec.REPOSITORY.decode(module, type_name, body)
        assert codec.decode(module, type_name, body, from_server=True) == expected
        in_slices = codec.decode_in_slices(module, type_name, body, 64 * 1024, from_server=True)
        assert in_slices == expected
        with pytest.raises(ProtocolError, match="budget of values"):
            codec.decode(module, type_name, body)


def test_a_register_of_many_payload_less_events_is_within_the_budget() -> None:
    """A hat client's 30,000 events of a one-letter type and no payload: 150,000 values in
    150 KB, more values than bytes, and a request as legitimate as any."""
    item = {"type": ["x"], "sourceTimestamp": ("none", None), "payload": ("none", None)}
    body = codec.encode("HatEventer", "MsgRegisterReq", [item] * 30_000)
    assert codec.decode("HatEventer", "MsgRegisterReq", body) == [item] * 30_000


def test_the_budget_holds_for_values_after_the_last_array() -> None:
    body = codec.encode(
        "HatSyncer",
        "MsgReq",
        {"lastEventId": {"server": 1, "session": 2, "instance": 3}, "clientName": "c"},
    )
    with pytest.raises(ProtocolError, match="budget of values"):
        codec.SCHEMAS.check("HatSyncer", "MsgReq", body, budget=0)
    assert codec.SCHEMAS.check("HatSyncer", "MsgReq", body, budget=100) is None


def test_a_stored_sbs_payload_goes_out_as_one_hat_data_or_not_at_all() -> None:
    data = codec.encode("Hat", "Data", {"module": ("none", None), "type": "T", "data": b"ab"})
    event = StoredEvent(1, EventId(1, 1, 1), ("a",), 1, None, data + b"\x80", PayloadKind.SBS, None)
    sound = replace(event, payload=data)
    assert codec.encode_event(event) == codec.encode_event(sound)  # the stray byte dropped
    with pytest.raises(ProtocolError, match=r"Hat\.Data"):
        codec.encode_event(replace(event, payload=b"\x81"))


def test_names_a_peer_makes_up_are_read_but_not_kept() -> None:
    known = dict(envelope._NAMES)
    for n in range(300):
        head = envelope.frame_head(1, 1, True, True, f"Made{n}", f"Up{n}", 0)
        received = envelope.parse(head[head[0] + 1 :])
        assert (received.module, received.type) == (f"Made{n}", f"Up{n}")
    assert known == envelope._NAMES


def test_a_choice_index_outside_the_schema_is_refused() -> None:
    item = codec.encode("HatEventer", "RegisterEvent", REGISTER_ITEM)
    bad = item[:-10] + b"\x89" + item[-9:]  # the payload kind index (3 kinds) set to 9
    assert codec.encode("HatEventer", "RegisterEvent", REGISTER_ITEM)[-10] == 0x81
    with pytest.raises(ProtocolError, match="choice index 9 at byte"):
        codec.decode("HatEventer", "MsgRegisterReq", b"\x81" + bad)


@pytest.mark.parametrize("count", [0, 1, 63, 64, 2500])
def test_hand_written_encodings_equal_hat_sbs(count: int) -> None:
    events = [
        StoredEvent(
            i, EventId(1, i, 0), ("t", str(i)), i, None, b"x" * (i % 50), PayloadKind.BINARY, None
        )
        for i in range(1, count + 1)
    ]
    records = [event_to_sbs(event) for event in events]
    assert codec.encode_events(events) == codec.encode("HatEventer", "MsgNotify", records)
    results = [e if e.position % 3 else None for e in events]
    values = [("failure", None) if e is None else ("event", event_to_sbs(e)) for e in results]
    assert codec.encode_register_results(results) == codec.encode(
        "HatEventer", "MsgRegisterRes", values
    )


def test_events_of_shared_sessions_and_timestamps_encode_as_hat_sbs() -> None:
    """Runs of events sharing a session and a timestamp (a register's reply, a notify) are
    encoded as hat-sbs encodes them, each event in full, however the runs change."""
    events = [
        StoredEvent(
            i,
            EventId(1 + i // 40, 5 + i // 7, i * 4099),
            ("t", str(i % 3)),
            1_700_000_000_000_000 + (i // 5) * 999_999,
            None if i % 4 else i,
            b"[%d]" % i,
            PayloadKind.JSON,
            None,
        )
        for i in range(120)
    ]
    records = [event_to_sbs(event) for event in events]
    assert codec.encode_events(events) == codec.encode("HatEventer", "MsgNotify", records)
    results = [None if e.position % 11 == 3 else e for e in events]
    values = [("failure", None) if e is None else ("event", event_to_sbs(e)) for e in results]
    assert codec.encode_register_results(results) == codec.encode(
        "HatEventer", "MsgRegisterRes", values
    )


_SBS_PAYLOADS = [
    codec.encode("Hat", "Data", {"module": module, "type": "T", "data": data})
    for module in (("none", None), ("value", "M"))
    for data in (b"", b"\x00\xff" * 40)
]


def _json_text(text: str) -> bytes:
    return json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")


@settings(max_examples=300, deadline=None)
@given(
    ids=st.tuples(*[st.integers(0, 2**63 - 1)] * 3),
    event_type=st.lists(st.text(max_size=70), max_size=5).map(tuple),
    timestamps=st.tuples(st.integers(-(2**62), 2**62), st.none() | st.integers(-(2**62), 2**62)),
    payload=st.one_of(
        st.none(),
        st.binary(max_size=300).map(lambda b: (PayloadKind.BINARY, b)),
        st.text(max_size=100).map(lambda t: (PayloadKind.JSON, _json_text(t))),
        st.sampled_from(_SBS_PAYLOADS).map(lambda b: (PayloadKind.SBS, b)),
    ),
)
def test_an_event_is_encoded_as_hat_sbs_encodes_it(
    ids: tuple[int, int, int],
    event_type: tuple[str, ...],
    timestamps: tuple[int, int | None],
    payload: tuple[PayloadKind, bytes] | None,
) -> None:
    kind, data = payload if payload is not None else (None, None)
    event = StoredEvent(0, EventId(*ids), event_type, *timestamps, data, kind, None)
    assert codec.encode_event(event) == codec.encode("HatEventer", "Event", event_to_sbs(event))


@pytest.mark.parametrize("count", [0, 1, 999, 5000])
def test_sliced_decoding_equals_decoding_at_once(count: int) -> None:
    items = [
        codec.register_event_to_sbs(NewEvent(("t", str(i)), b"x" * (i % 50), PayloadKind.BINARY))
        for i in range(count)
    ]
    body = codec.encode("HatEventer", "MsgRegisterReq", items)
    assert codec.decode_in_slices("HatEventer", "MsgRegisterReq", body, 4096) == codec.decode(
        "HatEventer", "MsgRegisterReq", body
    )
    slices = codec.SCHEMAS.check("HatEventer", "MsgRegisterReq", body, slice_bytes=4096)
    assert slices is not None and sum(part.count for part in slices) == count
    if count == 5000:
        assert len(slices) > 10


def test_every_message_the_codec_encodes_passes_the_pre_scan() -> None:
    query = codec.query_to_sbs(
        QueryData(
            event_ids=(EventId(1, 2, 3),), event_types=(("a", "*"),), t_from=-5, max_results=7
        )
    )
    records = [event_to_sbs(event) for event in EVENTS]
    messages = [
        ("HatEventer", "MsgQueryReq", query),
        ("HatEventer", "MsgQueryRes", records),
        ("HatEventer", "MsgNotify", records),
        ("HatEventer", "MsgRegisterRes", [("event", records[0]), ("failure", None)]),
        ("HatEventer", "MsgRegisterReq", [REGISTER_ITEM]),
        ("HatSyncer", "MsgEvents", records),
        ("TidingsEventer", "MsgRegisterReq", [{"outboxEventId": "o", "event": REGISTER_ITEM}]),
        ("Hat", "Data", {"module": ("none", None), "type": "T", "data": b"\x00" * 300}),
    ]
    for module, type_name, value in messages:
        encoded = codec.encode(module, type_name, value)
        assert codec.SCHEMAS.check(module, type_name, encoded) is None
        assert codec.decode(module, type_name, encoded) == codec.REPOSITORY.decode(
            module, type_name, encoded
        )


def _count_values(value: Any) -> int:
    """How many values a decoded message holds, as the pre-scan counts them."""
    if isinstance(value, dict):
        return 1 + sum(_count_values(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_count_values(v) for v in value)
    if isinstance(value, tuple):  # a choice: its index and its value
        return 1 + _count_values(value[1])
    return 0 if value is None else 1


_FUZZED = [
    ("HatEventer", "MsgRegisterReq", [REGISTER_ITEM] * 3),
    ("HatEventer", "MsgQueryReq", codec.query_to_sbs(QueryData(event_types=(("a", "*"),)))),
    ("HatEventer", "MsgNotify", [event_to_sbs(event) for event in EVENTS]),
    ("TidingsEventer", "MsgRegisterReq", [{"outboxEventId": "o", "event": REGISTER_ITEM}]),
]


@settings(max_examples=400, deadline=None)
@given(
    message=st.sampled_from(_FUZZED),
    edits=st.lists(
        st.tuples(
            st.sampled_from(["set", "insert", "delete"]), st.integers(0), st.integers(0, 255)
        ),
        min_size=1,
        max_size=4,
    ),
    cut=st.one_of(st.none(), st.integers(0)),
)
def test_bytes_the_pre_scan_passes_decode_within_their_budget(
    message: tuple[str, str, Any], edits: list[tuple[str, int, int]], cut: int | None
) -> None:
    """Whatever the bytes: they are refused as a ProtocolError (by the pre-scan, or by the
    decoder for what the pre-scan does not look at, such as UTF-8; nothing else escapes, a
    cut-short value included), or they decode into at most their budget of values."""
    module, type_name, value = message
    data = bytearray(codec.encode(module, type_name, value))
    for kind, at, byte in edits:
        at %= len(data) + 1
        if kind == "insert":
            data.insert(at, byte)
        elif at < len(data):
            if kind == "set":
                data[at] = byte
            else:
                del data[at]
    if cut is not None:
        del data[cut % (len(data) + 1) :]
    body = bytes(data)
    try:
        decoded = codec.decode(module, type_name, body)
    except ProtocolError:
        return
    assert _count_values(decoded) <= codec.value_budget(len(body))


def test_every_cut_of_a_message_is_refused_as_a_protocol_error() -> None:
    body = codec.encode("HatEventer", "MsgRegisterReq", [REGISTER_ITEM] * 2)
    for end in range(len(body)):
        with pytest.raises(ProtocolError, match="undecodable SBS"):
            codec.decode("HatEventer", "MsgRegisterReq", body[:end])


@pytest.mark.parametrize("body_size", [0, 5, 63, 64, 300, 70_000])
@pytest.mark.parametrize(
    ("message_id", "first", "owner", "last", "module", "type_name"),
    [
        (7, 3, False, True, "HatEventer", "MsgQueryRes"),
        (1, 1, True, False, "HatPing", "MsgPing"),
        (2**40, 2**63 - 1, False, False, "HatSyncer", "MsgEvents"),
    ],
)
def test_frame_head_plus_body_is_the_encoded_frame(
    body_size: int,
    message_id: int,
    first: int,
    owner: bool,
    last: bool,
    module: str,
    type_name: str,
) -> None:
    """The hand-written head is what hat-sbs encodes for the whole frame."""
    body = bytes(range(256)) * (body_size // 256) + b"b" * (body_size % 256)
    head = envelope.frame_head(message_id, first, owner, last, module, type_name, len(body))
    expected = raw_frame(
        module, type_name, body, message_id=message_id, first=first, owner=owner, last=last
    )
    assert head + body == expected
    parsed = envelope.parse(expected[1 + expected[0] :])
    assert (parsed.id, parsed.first, parsed.owner, parsed.last) == (message_id, first, owner, last)
    assert (parsed.module, parsed.type, bytes(parsed.body)) == (module, type_name, body)


def test_encode_integer_is_hat_sbs_integer() -> None:
    values = [0, 1, 63, 64, 127, 128, 8191, 8192, 2**20 - 1, 2**20, 2**31, 2**63 - 1, -1, -64]
    values += [-65, -(2**63)]
    values += [2**k + d for k in range(1, 64) for d in (-1, 0, 1)]
    values += [-(2**k) + d for k in range(1, 63) for d in (-1, 0, 1)]
    for value in (v for v in values if -(2**63) <= v < 2**63):  # hat-sbs's range
        assert codec.encode_integer(value) == codec.REPOSITORY.encode(None, "Integer", value), value


# --- addresses ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("tcp+sbs://127.0.0.1:23012", ("127.0.0.1", 23012)),
        ("tcp+sbs://localhost:0", ("localhost", 0)),
        ("tcp+sbs://[::1]:5/", ("::1", 5)),
        ("ssl+sbs://example.org:23012", ("example.org", 23012)),
    ],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected
    assert parse_endpoint(address).tls == address.startswith("ssl+sbs")


@pytest.mark.parametrize(
    ("address", "message"),
    [
        (23012, "must be a string"),
        ("tls://127.0.0.1:1", "scheme must be tcp\\+sbs or ssl\\+sbs"),
        ("tcp://127.0.0.1:1", "scheme must be tcp\\+sbs or ssl\\+sbs"),
        ("127.0.0.1:1", "scheme must be tcp\\+sbs"),
        ("ssl+sbs://127.0.0.1", "expected ssl\\+sbs://HOST:PORT"),
        ("tcp+sbs://127.0.0.1", "expected tcp\\+sbs://HOST:PORT"),
        ("tcp+sbs://:1", "expected tcp\\+sbs://HOST:PORT"),
        ("tcp+sbs://127.0.0.1:1/path", "expected tcp\\+sbs://HOST:PORT"),
        ("tcp+sbs://127.0.0.1:99999", "out of range"),
        ("tcp+sbs://127.0.0.1:port", "address"),
    ],
)
def test_parse_address_errors(address: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_address(address)


# --- framing --------------------------------------------------------------------------------

#: The frame a real hat-event 0.8.5 server accepted (docs/hat-event-0.8.5-protocol.md, §5).
VERIFIED_FRAME = bytes.fromhex(
    "012f"
    "8181010100"
    "818a" + b"HatEventer".hex() + "8e" + b"MsgRegisterReq".hex() + "8e"
    "818283" + b"raw".hex() + "81" + b"x".hex() + "808180"
    "82" + b"hi".hex()
)


def test_frame_matches_the_verified_hat_event_frame() -> None:
    async def main() -> bytes:
        connection, raw_reader, _raw_writer = await socket_pair()
        item = {"type": ["raw", "x"], "sourceTimestamp": ("none", None)}
        item["payload"] = ("value", ("binary", b"hi"))
        connection.send("HatEventer", "MsgRegisterReq", [item], last=False)
        await connection.drain()
        data = await raw_reader.readexactly(len(VERIFIED_FRAME))
        await connection.aclose()
        return data

    assert run(main()) == VERIFIED_FRAME
    assert (
        raw_message(
            "HatEventer",
            "MsgRegisterReq",
            [
                {
                    "type": ["raw", "x"],
                    "sourceTimestamp": ("none", None),
                    "payload": ("value", ("binary", b"hi")),
                }
            ],
            last=False,
        )
        == VERIFIED_FRAME
    )


@pytest.mark.parametrize(("payload_size", "length_size"), [(10, 1), (300, 2), (70_000, 3)])
def test_frame_length_uses_the_fewest_bytes(payload_size: int, length_size: int) -> None:
    async def main() -> tuple[int, int, bytes]:
        connection, raw_reader, _raw_writer = await socket_pair()
        item = {"type": ["a"], "sourceTimestamp": ("none", None)}
        item["payload"] = ("value", ("binary", b"p" * payload_size))
        connection.send("HatEventer", "MsgRegisterReq", [item])
        await connection.drain()
        first = (await raw_reader.readexactly(1))[0]
        size = int.from_bytes(await raw_reader.readexactly(first), "big")
        body = await raw_reader.readexactly(size)
        await connection.aclose()
        return first, size, body

    first, size, body = run(main())
    assert first == length_size
    assert size.bit_length() > 8 * (length_size - 1)
    assert codec.decode("Hat", "Msg", body)["data"]["type"] == "MsgRegisterReq"


# --- conversations and pings ----------------------------------------------------------------


def test_request_reply_and_receive() -> None:
    """Replies resolve requests by conversation; other messages queue for receive()."""

    async def main() -> None:
        ours, theirs = socket.socketpair()
        a = Connection(*await asyncio.open_connection(sock=ours), ping_interval=None)
        b = Connection(*await asyncio.open_connection(sock=theirs), ping_interval=None)
        query = codec.query_to_sbs(QueryData())
        request = asyncio.create_task(a.request("HatEventer", "MsgQueryReq", query))
        await asyncio.sleep(0)  # the request is sent first, as message 1
        a.send("HatEventer", "MsgSubscribe", [["x"]])
        received = await b.receive()
        assert (received.type, received.first, received.last) == ("MsgQueryReq", True, False)
        assert received.conversation == chatter.Conversation(owner=False, first_id=1)
        subscribe = await b.receive()
        assert (subscribe.type, subscribe.data, subscribe.last) == ("MsgSubscribe", [["x"]], True)
        b.send("HatEventer", "MsgNotify", [])  # unrelated: goes to a.receive()
        b.send("HatEventer", "MsgQueryRes", [], conversation=received.conversation)
        reply = await request
        assert (reply.type, reply.data, reply.first) == ("MsgQueryRes", [], False)
        assert (await a.receive()).type == "MsgNotify"
        await a.aclose()
        with pytest.raises(ConnectionClosed):
            await b.receive()
        await b.aclose()

    run(main())


def test_messages_taken_directly_keep_their_order_with_the_queued_ones() -> None:
    """take_directly(): while the receiver waits with nothing queued, the handler is offered
    each message and what it takes is not queued; what it leaves, and everything received
    while the receiver is busy, is queued, so the receiver's order is the order received."""

    async def main() -> list[tuple[str, object]]:
        ours, theirs = socket.socketpair()
        a = Connection(*await asyncio.open_connection(sock=ours), ping_interval=None)
        b = Connection(*await asyncio.open_connection(sock=theirs), ping_interval=None)
        handled: list[tuple[str, object]] = []
        release = asyncio.Event()

        def take(message: chatter.Message) -> bool:
            if message.type != "MsgSubscribe":
                return False
            handled.append(("direct", message.data))
            return True

        b.take_directly(take)

        async def receiver() -> None:
            while True:
                message = await b.receive()
                handled.append(("queued", message.data))
                if message.type == "MsgNotify":
                    await release.wait()  # busy: what comes meanwhile is queued

        task = asyncio.create_task(receiver())
        await asyncio.sleep(0)  # the receiver waits
        a.send("HatEventer", "MsgSubscribe", [["1"]])  # taken directly
        await until(lambda: len(handled) == 1)
        a.send("HatEventer", "MsgNotify", [])  # left to the receiver, which stays busy
        await until(lambda: len(handled) == 2)
        a.send("HatEventer", "MsgSubscribe", [["2"]])  # the receiver is busy: queued
        await until(lambda: b.has_received)
        release.set()
        await until(lambda: len(handled) == 3)  # and it waits again
        a.send("HatEventer", "MsgSubscribe", [["3"]])  # taken directly
        await until(lambda: len(handled) == 4)
        task.cancel()
        await a.aclose()
        await b.aclose()
        return handled

    assert run(main()) == [
        ("direct", [["1"]]),
        ("queued", []),
        ("queued", [["2"]]),
        ("direct", [["3"]]),
    ]


def test_a_peer_over_the_lag_bound_is_too_slow_only_once_it_stops_taking_bytes() -> None:
    """lagging(): over the bound is fine while the peer takes bytes; taking nothing for the
    grace period, or being four times over, makes it too slow."""

    async def main() -> None:
        ours, theirs = socket.socketpair()  # theirs: read only when the test says so
        connection = Connection(*await asyncio.open_connection(sock=ours), ping_interval=None)
        limit, grace = 64 * 1024, 0.3
        body = b"\x00" * 16384  # the raw peer never decodes it
        while connection.send_buffer_bytes <= limit:  # the socket pair's buffers fill first
            connection.send_encoded("HatEventer", "MsgNotify", body)
        assert connection.lagging(limit, grace, "bound") is None  # just went over
        await asyncio.sleep(grace + 0.1)
        assert connection.lagging(limit, grace, "bound") is not None  # took nothing
        theirs.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while theirs.recv(65536):  # the peer reads what the kernel holds, no more
                pass
        async with asyncio.timeout(5):  # once the loop has written into the room it made
            while connection.lagging(limit, grace, "bound") is not None:  # it is reading
                await asyncio.sleep(0.01)
        while connection.send_buffer_bytes <= 4 * limit:
            connection.send_encoded("HatEventer", "MsgNotify", body)
        reason = connection.lagging(limit, grace, "bound")
        assert reason is not None and "over 4 x bound=65536" in reason
        connection.close(reason)
        theirs.close()

    run(main())


def test_pings_are_answered() -> None:
    async def main() -> None:
        connection, raw_reader, raw_writer = await socket_pair()
        raw_writer.write(raw_message("HatPing", "MsgPing", None, message_id=1, last=False))
        envelope, body = await read_raw_frame(raw_reader)
        assert envelope["data"]["type"] == "MsgPong"
        assert (envelope["first"], envelope["owner"], envelope["last"]) == (1, False, True)
        assert body is None
        await connection.aclose()

    run(main())


def test_silent_peer_is_dropped_after_a_ping(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> str | None:
        connection, raw_reader, _raw_writer = await socket_pair(ping_interval=0.05)
        envelope, _ = await read_raw_frame(raw_reader)
        assert envelope["data"]["type"] == "MsgPing"
        await asyncio.wait_for(connection.wait_closed(), 2)
        await connection.aclose()
        return connection.close_reason

    assert run(main()) == "no ping reply within 0.05 s"
    [line] = warnings_of(caplog)
    assert line.endswith("closed: no ping reply within 0.05 s")


def test_reading_pauses_once_unread_messages_exceed_the_byte_bound() -> None:
    """What a peer sends beyond the bound waits in its own socket (TCP pushes back), not in
    our memory; once we read, everything arrives in order."""

    async def main() -> None:
        ours, theirs = socket.socketpair()
        slow = Connection(
            *await asyncio.open_connection(sock=ours), ping_interval=None, max_queued_bytes=2**20
        )
        busy = Connection(*await asyncio.open_connection(sock=theirs), ping_interval=None)
        big = [["x" * 2**18]]  # 256 KiB each, 40 of them: 10 MiB, far over the bound
        for _ in range(40):
            busy.send("HatEventer", "MsgSubscribe", big)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(busy.drain(), 0.5)
        received = [(await slow.receive()).data for _ in range(40)]
        assert received == [big] * 40
        await busy.drain()
        await slow.aclose()
        await busy.aclose()

    run(main())


def test_a_peer_we_do_not_read_fast_enough_is_not_dropped_for_missing_pongs() -> None:
    """Its pong waits in the socket behind messages we have not taken: it is not idle."""

    async def main() -> None:
        ours, theirs = socket.socketpair()
        # 200 ms: room for a loaded machine, where a 50 ms pong deadline was once missed by
        # the answering side itself (both ends share this event loop).
        slow = Connection(*await asyncio.open_connection(sock=ours), ping_interval=0.2)
        busy = Connection(*await asyncio.open_connection(sock=theirs), ping_interval=None)
        sent = 2000
        for n in range(sent):
            busy.send("HatEventer", "MsgSubscribe", [[str(n)]])
        await asyncio.sleep(1.5)  # many ping intervals with the queue full
        assert slow.is_open
        received = [(await slow.receive()).data for _ in range(sent)]
        assert received == [[[str(n)]] for n in range(sent)]
        await slow.aclose()
        await busy.aclose()

    run(main())


# --- bad input ------------------------------------------------------------------------------

BAD_INPUT = {
    "length-of-length 0": (b"\x00\x05hello", "length of length 0"),
    "length-of-length 9": (b"\x09" + b"\x00" * 9, "length of length 9"),
    "truncated frame": (b"\x01\x64" + b"x" * 10, "truncated frame (10 of 100 bytes)"),
    "oversize frame": (b"\x03\x01\x00\x00", "frame of 65536 bytes exceeds the limit of 1024"),
    "undecodable envelope": (length_prefixed(b"\x85\x00"), "Hat.Msg: undecodable SBS"),
    "unknown type": (
        raw_frame("HatEventer", "MsgBogus", b""),
        "unknown message type HatEventer.MsgBogus",
    ),
    "unknown module": (raw_frame("Bogus", "MsgPing", b""), "unknown message type Bogus.MsgPing"),
    "no module": (raw_frame(None, "MsgPing", b""), "unknown message type None.MsgPing"),
    "undecodable body": (
        raw_frame("HatEventer", "MsgRegisterReq", b"\x85"),
        "HatEventer.MsgRegisterReq: undecodable SBS",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_closes_the_connection_with_one_log_line(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    data, reason = BAD_INPUT[case]

    async def main() -> str | None:
        connection, raw_reader, raw_writer = await socket_pair(max_frame_bytes=1024)
        raw_writer.write(data)
        raw_writer.write_eof()
        await asyncio.wait_for(connection.wait_closed(), 5)
        with pytest.raises(ConnectionClosed):
            await connection.receive()
        with pytest.raises(ConnectionClosed):
            connection.send("HatEventer", "MsgSubscribe", [])
        await wait_peer_closed(raw_reader)
        await connection.aclose()
        return connection.close_reason

    close_reason = run(main())
    assert close_reason is not None and reason in close_reason
    [line] = warnings_of(caplog)
    assert reason in line


def test_clean_end_of_stream_is_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> str | None:
        connection, _raw_reader, raw_writer = await socket_pair()
        raw_writer.write(raw_message("HatEventer", "MsgSubscribe", [["a"]]))
        raw_writer.close()
        message = await connection.receive()
        assert message.data == [["a"]]
        await asyncio.wait_for(connection.wait_closed(), 5)
        await connection.aclose()
        return connection.close_reason

    assert run(main()) is None
    assert warnings_of(caplog) == []


def test_closing_does_not_wait_for_a_peer_that_never_reads() -> None:
    """aclose() drops unsent bytes after a bounded wait instead of hanging on the peer."""

    async def main() -> None:
        connection, _raw_reader, _raw_writer = await socket_pair()
        item = {"type": ["a"], "sourceTimestamp": ("none", None)}
        item["payload"] = ("value", ("binary", b"p" * 1_000_000))
        for _ in range(20):
            connection.send("HatEventer", "MsgRegisterReq", [item])
        assert connection.send_buffer_bytes > 0
        connection.close("test: peer too slow")
        assert connection.send_buffer_bytes == 0
        await asyncio.wait_for(connection.aclose(), 2)

    run(main())


def test_server_close_waits_for_handlers() -> None:
    async def main() -> list[str]:
        done: list[str] = []

        async def handler(connection: Connection) -> None:
            try:
                await connection.receive()
            finally:
                await asyncio.sleep(0.05)
                done.append(connection.peer)

        server = await chatter_server.listen("tcp+sbs://127.0.0.1:0", handler, ping_interval=None)
        client = await chatter_client.connect(local_address(server.port), ping_interval=None)
        while not server.connections:
            await asyncio.sleep(0.01)
        await server.aclose()
        await client.aclose()
        return done

    assert len(run(main())) == 1


# --- large frames: read and decoded in pieces, written as a stream ---------------------------


def test_a_large_message_arrives_whole_and_a_large_hostile_one_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bodies over INLINE_DECODE_BYTES take the decode thread (pre-scan and sliced decode)."""
    items = [
        codec.register_event_to_sbs(NewEvent(("big", str(i)), b"p" * 100, PayloadKind.BINARY))
        for i in range(20_000)
    ]
    hostile = codec.encode_integer(3_000_000) + b"\x80" * 3_000_000  # 3 M one-byte types

    async def main() -> str | None:
        connection, _raw_reader, raw_writer = await socket_pair()
        raw_writer.write(raw_message("HatEventer", "MsgRegisterReq", items))
        message = await connection.receive()
        assert message.data == items
        raw_writer.write(raw_frame("HatEventer", "MsgSubscribe", hostile))
        await asyncio.wait_for(connection.wait_closed(), 5)
        await connection.aclose()
        return connection.close_reason

    assert (
        len(codec.encode("HatEventer", "MsgRegisterReq", items)) > frame_reader.INLINE_DECODE_BYTES
    )
    reason = run(main())
    assert reason is not None and "exceeds the message's budget of values" in reason
    [line] = warnings_of(caplog)
    assert "HatEventer.MsgSubscribe: undecodable SBS" in line


async def _pieces(data: bytes, size: int, between: Any = None) -> Any:
    for start in range(0, len(data), size):
        yield data[start : start + size]
        if between is not None:
            between()


def test_a_streamed_frame_equals_the_frame_sent_whole_and_others_wait_for_it() -> None:
    body = codec.encode("HatEventer", "MsgQueryRes", [event_to_sbs(e) for e in EVENTS] * 50)

    async def main() -> None:
        connection, raw_reader, _raw_writer = await socket_pair()
        conversation = chatter.Conversation(owner=False, first_id=9)

        def notify() -> None:  # sent while the reply is being written: must follow it
            connection.send("HatEventer", "MsgNotify", [])

        await connection.send_stream(
            "HatEventer",
            "MsgQueryRes",
            len(body),
            _pieces(body, 1000, notify),
            conversation=conversation,
            stall_seconds=5,
        )
        expected = raw_frame("HatEventer", "MsgQueryRes", body, message_id=1, first=9, owner=False)
        assert await raw_reader.readexactly(len(expected)) == expected
        for _ in range(len(body) // 1000 + 1):
            envelope, value = await read_raw_frame(raw_reader)
            assert (envelope["data"]["type"], value) == ("MsgNotify", [])
        assert envelope["id"] == len(body) // 1000 + 2
        await connection.aclose()

    run(main())


def test_a_streamed_frame_that_does_not_add_up_closes_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> str | None:
        connection, _raw_reader, _raw_writer = await socket_pair()
        with pytest.raises(ConnectionClosed, match="corrupt streamed frame"):
            await connection.send_stream(
                "HatEventer", "MsgQueryRes", 100, _pieces(b"x" * 99, 10), stall_seconds=5
            )
        await connection.aclose()
        return connection.close_reason

    assert run(main()) == "HatEventer.MsgQueryRes: 99 bytes of an announced 100"
    assert len(warnings_of(caplog)) == 1


def test_a_peer_that_stops_reading_a_streamed_frame_is_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A reply nobody reads does not pin the connection: no progress in stall_seconds."""

    async def main() -> str | None:
        connection, _raw_reader, _raw_writer = await socket_pair()
        body = b"x" * 64 * 1024 * 1024
        with pytest.raises(ConnectionClosed, match="not reading"):
            await connection.send_stream(
                "HatEventer", "MsgQueryRes", len(body), _pieces(body, 256 * 1024), stall_seconds=0.2
            )
        await connection.aclose()
        return connection.close_reason

    assert run(main()) == "peer took nothing of a reply for 0.2 s"
    assert len(warnings_of(caplog)) == 1


def test_a_json_payload_deeper_than_the_stack_is_refused_new_and_kept_when_stored() -> None:
    """Issue 30: a new event's payload nested past the interpreter's stack is a
    ProtocolError for that event (not a RecursionError ending the link); one a server
    stored already (a peer's, a reply's) passes as its origin took it."""
    deep = "[" * 30_000 + "]" * 30_000
    with pytest.raises(ProtocolError, match=r"event 0\.payload: json payload is nested too deeply"):
        codec.payload_from_sbs(("json", deep), "event 0.payload", strict=True)
    assert codec.payload_from_sbs(("json", deep), "event.payload") == (
        PayloadKind.JSON,
        deep.encode(),
    )
