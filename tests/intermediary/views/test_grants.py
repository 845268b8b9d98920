"""Grants: which event types, tables and regions an identity may subscribe to. Event types
are decided by coverage of Hat patterns (a wider pattern is refused, a combination of
granted ones is allowed), regions by coverage of the granted boxes; every refusal names
the identity and what it may not have."""

from __future__ import annotations

import pytest

from tidings.errors import SubscriptionRefused
from tidings.intermediary.regions.geometry import parse_region
from tidings.intermediary.views.grants import NOTHING, Grant

GRANT = Grant.of(
    "dash",
    [("app", "orders", "*"), ("app", "users"), ("audit", "?")],
    ["users", "Orders"],
    [([0, 0], [50, 100]), ([50, 0], [100, 50])],
)


@pytest.mark.parametrize(
    "pattern",
    [("app", "orders"), ("app", "orders", "*"), ("app", "orders", "?", "x"), ("app", "users"),
     ("audit", "x"), ("audit", "?")],
)  # fmt: skip
def test_patterns_the_grant_covers_are_allowed(pattern: tuple[str, ...]) -> None:
    GRANT.check_events([pattern])


@pytest.mark.parametrize(
    "pattern",
    [("app", "*"), ("*",), ("app", "?"), ("app", "users", "x"), ("audit", "*"), ("secret",)],
)
def test_patterns_reaching_past_the_grant_are_refused_naming_both(pattern: tuple[str, ...]) -> None:
    with pytest.raises(SubscriptionRefused) as caught:
        GRANT.check_events([("app", "orders"), pattern])
    message = str(caught.value)
    assert message.startswith("subscriber 'dash' may not subscribe to events [")
    assert ", ".join(pattern) in message and "[app, orders, *]" in message  # what it may


def test_a_pattern_covered_only_by_granted_ones_together_is_allowed() -> None:
    split = Grant.of("s", [("a",), ("a", "?", "*")], [], [])
    split.check_events([("a", "*")])


def test_a_pattern_too_costly_to_decide_is_refused_though_covered() -> None:
    """The crafted grant of the coverage tests: ``?`` x 16 is covered, but deciding it takes
    past the bound, and the answer past the bound is no."""
    crafted = [(*("?" * i), f"x{a}", *("?" * (14 - i)), f"z{i}{a}") for i in range(15)
               for a in range(2)]  # fmt: skip
    crafted.append((*("?" * 15), "*"))
    with pytest.raises(SubscriptionRefused, match="may not subscribe to events"):
        Grant.of("c", crafted, [], []).check_events([("?",) * 16])


def test_tables_are_granted_by_name_case_insensitively() -> None:
    GRANT.check_tables(["users", "ORDERS"])
    with pytest.raises(SubscriptionRefused, match=r"'dash' may not subscribe to table secrets \("):
        GRANT.check_tables(["users", "secrets"])


def test_regions_inside_the_union_of_the_granted_boxes_are_allowed() -> None:
    for spec in (
        {"box": {"lo": [10, 10], "hi": [90, 40]}},  # spans both boxes
        {"sphere": {"center": [25, 50], "radius": 20}},
        {"box": {"lo": [0, 0], "hi": [50, 100]}},  # a granted box exactly
    ):
        GRANT.check_region(parse_region(spec))


@pytest.mark.parametrize(
    "spec",
    [
        {"box": {"lo": [60, 60], "hi": [70, 70]}},  # outside both
        {"box": {"lo": [40, 40], "hi": [60, 60]}},  # partly outside
        {"sphere": {"center": [50, 50], "radius": 10}},
        {"box": {"lo": [1, 1, 1], "hi": [2, 2, 2]}},  # 3D, the grant is 2D
    ],
)
def test_regions_reaching_outside_the_grant_are_refused_naming_both(spec: dict) -> None:
    with pytest.raises(SubscriptionRefused) as caught:
        GRANT.check_region(parse_region(spec))
    message = str(caught.value)
    assert message.startswith("subscriber 'dash' may not subscribe to the region [")
    assert "box [0.0, 0.0]..[50.0, 100.0]" in message


def test_a_relative_region_needs_a_grant_of_every_region() -> None:
    relative = parse_region({"sphere": {"center": [0, 0], "radius": 1}, "relative_to": 7})
    with pytest.raises(SubscriptionRefused, match="relative to entity 7"):
        GRANT.check_region(relative)
    Grant.of("all", [], [], "*").check_region(relative)


def test_everything_and_nothing() -> None:
    everything = Grant.of("root", [("*",)], ["*"], "*")
    everything.check_events([("any", "thing", "*")])
    everything.check_tables(["whatever"])
    everything.check_region(parse_region({"box": {"lo": [-1e9, 0], "hi": [1e9, 1]}}))
    with pytest.raises(SubscriptionRefused, match="allowed: no event types"):
        NOTHING.check_events([("a",)])
    with pytest.raises(SubscriptionRefused, match="allowed: no tables"):
        NOTHING.check_tables(["a"])
    with pytest.raises(SubscriptionRefused, match="allowed: no regions"):
        NOTHING.check_region(parse_region({"box": {"lo": [0, 0], "hi": [1, 1]}}))
