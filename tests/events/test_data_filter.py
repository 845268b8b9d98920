"""The data filter language: JSON Pointers to conditions, compared by JSON value, failing
closed, and refused at compile time with the pointer named."""

from __future__ import annotations

from typing import Any

import pytest

from tidings.errors import ConfigError
from tidings.events.data_filter import MAX_CONDITIONS, compile_filter, parse_pointer

ORDER = {
    "tenant": "acme",
    "order": {"region": "eu", "lines": [{"sku": "A1"}, {"sku": "B2"}]},
    "amount": 10,
    "vip": False,
    "a/b": "slash",
    "m~n": "tilde",
    "note": None,
}


@pytest.mark.parametrize(
    ("where", "passes"),
    [
        ({"/tenant": "acme"}, True),
        ({"/tenant": "other"}, False),
        ({"/tenant": {"equals": "acme"}}, True),
        ({"/order/region": {"in": ["eu", "uk"]}}, True),
        ({"/order/region": {"in": ["us"]}}, False),
        ({"/order/region": {"not_in": ["us"]}}, True),
        ({"/order/region": {"not_in": ["eu"]}}, False),
        ({"/order/lines/1/sku": "B2"}, True),
        ({"/order/lines/2/sku": "B2"}, False),  # no third line
        ({"/order/lines/01/sku": "B2"}, False),  # not an array index in RFC 6901
        ({"/a~1b": "slash", "/m~0n": "tilde"}, True),
        ({"/note": None}, True),
        ({"/note": {"exists": True}}, True),
        ({"/missing": {"exists": False}}, True),
        ({"/missing": {"exists": True}}, False),
        ({"/tenant": "acme", "/amount": 11}, False),  # every condition must hold
        ({"/amount": 10.0}, True),  # one JSON number
        ({"/amount": "10"}, False),  # a string is not a number
        ({"/vip": 0}, False),  # false is not 0 (Python's False == 0 must not pass)
        ({"/vip": False}, True),
        ({"/order": "eu"}, False),  # an object equals no scalar
    ],
)
def test_conditions_hold_by_json_value(where: dict[str, Any], passes: bool) -> None:
    assert compile_filter(where)(ORDER) is passes


@pytest.mark.parametrize("operator", ["equals", "in", "not_in"])
def test_a_missing_value_fails_every_comparison(operator: str) -> None:
    """A filter fails closed: data without the field is not let through, not even by
    ``not_in`` (only ``exists: false`` asks for absence)."""
    operand = "x" if operator == "equals" else ["x"]
    condition = compile_filter({"/tenant": {operator: operand}})
    for data in ({}, None, "text", [1, 2], {"tenant": {"nested": 1}}):
        expected = operator == "not_in" and isinstance(data, dict) and "tenant" in data
        assert condition(data) is expected, data


def test_the_whole_data_is_the_empty_pointer() -> None:
    assert compile_filter({"": {"in": ["a", "b"]}})("a")
    assert not compile_filter({"": "a"})({"a": 1})
    assert parse_pointer("/a~1b/~0/") == ("a/b", "~", "")


@pytest.mark.parametrize(
    ("where", "error"),
    [
        ({"tenant": "acme"}, r"'tenant' is not a JSON Pointer: it starts with /"),
        ({"/a~2": 1}, r"'~' in a JSON Pointer is written ~0"),
        ({"/t": {"gt": 1}}, r"/t: give one of equals, in, not_in, exists .* not gt"),
        ({"/t": {"in": 1, "equals": 2}}, r"/t: give one of"),
        ({"/t": {"in": []}}, r"/t: in takes a non-empty list"),
        ({"/t": {"not_in": "abc"}}, r"/t: not_in takes a non-empty list"),
        ({"/t": [1, 2]}, r"/t: a list is not a JSON scalar"),
        ({"/t": {"in": [1, {"a": 1}]}}, r"/t: a dict is not a JSON scalar"),
        ({"/t": float("nan")}, r"/t: nan is not a JSON scalar"),
        ({"/t": {"exists": "yes"}}, r'/t: exists takes true or false, not "yes"'),
        ({}, r"at least one condition"),
        ({f"/k{i}": i for i in range(MAX_CONDITIONS + 1)}, r"at most 64 conditions"),
        ({"/" + "/".join("x" * 40): 1}, r"deeper than 32 segments"),
    ],
)
def test_bad_filters_are_refused_naming_the_pointer(where: Any, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        compile_filter(where)


def test_a_filter_reads_as_written() -> None:
    where = {"/tenant": "acme", "/region": {"in": ["eu", "uk"]}, "/x": {"exists": False}}
    assert compile_filter(where).describe() == (
        '/tenant = "acme" and /region in ["eu", "uk"] and /x is absent'
    )
