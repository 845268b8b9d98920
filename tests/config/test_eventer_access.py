"""``eventer_server.anonymous`` and ``eventer_server.identities``: the defaults (anonymous
clients on loopback, granted everything), patterns checked on load, and a password hash
checked and never shown in an error."""

from __future__ import annotations

from typing import Any

import pytest

from tidings.config.eventer_access import EVERYTHING
from tidings.config.passwords import hash_password
from tidings.config.server import load_server_config
from tidings.errors import ConfigError


def server(**eventer: Any) -> dict[str, Any]:
    return {
        "type": "event",
        "backend": {"module": "tidings.server.backends.sqlite", "db_path": "events.db"},
        "engine": {"server_id": 1},
        "eventer_server": eventer,
    }


def test_by_default_anonymous_clients_are_served_on_loopback_with_everything() -> None:
    eventer = load_server_config(server()).eventer_server
    assert eventer.anonymous.allowed_from == "loopback"
    assert eventer.anonymous.patterns("register") == EVERYTHING
    assert eventer.identities == {}


def test_identities_and_their_grants_load_as_patterns() -> None:
    digest = hash_password("pw", n=2**4)
    eventer = load_server_config(
        server(
            anonymous={"allowed_from": "nowhere", "may_register": []},
            identities={
                "relay": {"may_register": [["orders", "*"]], "may_query": [["orders", "?"]]},
                "app": {"password_hash": digest, "may_subscribe": [["a", "b"]]},
            },
        )
    ).eventer_server
    assert eventer.anonymous.patterns("register") == ()
    relay = eventer.identities["relay"]
    assert relay.patterns("register") == (("orders", "*"),)
    assert relay.patterns("subscribe") == EVERYTHING
    assert eventer.identities["app"].password_hash == digest


@pytest.mark.parametrize(
    ("eventer", "message"),
    [
        (
            {"identities": {"r": {"may_register": [["*", "x"]]}}},
            "eventer_server.identities.r.may_register: ['*', 'x'] is not an event type pattern",
        ),
        (
            {"identities": {"r": {"may_query": "orders"}}},
            "eventer_server.identities.r.may_query",
        ),
        ({"anonymous": {"allowed_from": "lan"}}, "eventer_server.anonymous.allowed_from"),
        ({"identities": {" r": {}}}, "is not an identity name"),
        ({"identities": {"r": {"may_publish": []}}}, "identities.r.may_publish: unknown key"),
    ],
)
def test_a_bad_grant_is_named(eventer: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_server_config(server(**eventer))
    assert message in str(info.value)


def test_a_clear_password_is_refused_without_being_shown() -> None:
    with pytest.raises(ConfigError) as info:
        load_server_config(server(identities={"r": {"password_hash": "hunter2"}}))
    assert "identities.r.password_hash" in str(info.value)
    assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_server_config(server(identities={"r": {"password": "hunter2"}}))
    assert "hunter2" not in str(info.value)
