"""Stream users' ``allow`` lists in the event server's file: what loads, and what is
refused with the key named (a typo in a permission must not deny in silence)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.stream_helpers import OTHER_USER, USER, stream_server_config
from tidings.config.streams import load_stream_server_config
from tidings.errors import ConfigError


def _with_allow(tmp_path, allow: Any, **top: Any) -> dict[str, Any]:
    config = stream_server_config(f"sqlite:///{tmp_path}/x.db")
    config["stream_users"][USER]["allow"] = allow
    return config | top


def test_grants_load_with_their_defaults(tmp_path) -> None:
    allow = [
        {"streams": ["s"], "components": ["BILL*", "LIVE"], "types": ["ORDER"]},
        {"streams": ["*"], "add_event": ["P*"], "where": {"/tenant": "acme"}},
    ]
    loaded = load_stream_server_config(_with_allow(tmp_path, allow))
    grants = loaded.stream_users[USER].allow
    assert grants is not None
    assert grants[1].components == ["*"] and grants[1].types == ["*"]
    assert grants[0].add_event == [] and grants[0].where is None
    # The other user has no allow list: it may do everything, and is named as such.
    assert loaded.unrestricted_users() == [OTHER_USER]


@pytest.mark.parametrize(
    ("allow", "error"),
    [
        (
            [{"streams": ["orders"]}],
            r"allow\.0\.streams: 'orders' matches no stream \(the streams: s\)",
        ),
        (
            [{"streams": ["s"], "types": ["PAYMENT"]}],
            r"allow\.0\.types: 'PAYMENT' matches no type that stream s carries "
            r"\(AUDIT, ORDER, PAY\)",
        ),
        (
            [{"streams": ["s"], "add_event": ["AUDIT"]}],
            r"allow\.0\.add_event: 'AUDIT' matches no type that stream s can generate with "
            r"addEvent \(ORDER, PAY\)",
        ),
        (
            [{"streams": ["s"], "components": ["BILL ING"]}],
            r"allow\.0\.components: 'BILL ING' is not a name or a pattern here",
        ),
        ([{"streams": ["s"], "types": ["order"]}], r"allow\.0\.types: 'order' is not a name"),
        ([{"streams": []}], r"allow\.0\.streams"),
        (
            [{"streams": ["s"], "components": []}],
            r"allow\.0: this grant allows nothing",
        ),
        (
            [{"streams": ["s"], "where": {"tenant": "x"}}],
            r"allow\.0\.where: 'tenant' is not a JSON Pointer",
        ),
        (
            [{"streams": ["s"], "where": {"/t": {"in": "x"}}}],
            r"allow\.0\.where: /t: in takes a non-empty list",
        ),
        ([{"streams": ["s"], "read": ["ORDER"]}], r"allow\.0\.read: unknown key"),
        (None, r"allow: allow is empty \(null\): write \[\] for a user that may do nothing"),
    ],
)
def test_bad_grants_are_refused_naming_the_key(tmp_path, allow: Any, error: str) -> None:
    with pytest.raises(ConfigError, match=rf"stream_users\.{USER}\.{error}"):
        load_stream_server_config(_with_allow(tmp_path, allow))


def test_stream_allow_required_refuses_users_without_a_list(tmp_path) -> None:
    config = _with_allow(tmp_path, [], stream_allow_required=True)
    with pytest.raises(
        ConfigError, match=rf"no allow list for {OTHER_USER}, and stream_allow_required is set"
    ):
        load_stream_server_config(config)
    config["stream_users"][OTHER_USER]["allow"] = []  # may do nothing: allowed to say so
    assert load_stream_server_config(config).unrestricted_users() == []
