"""Every listening port's accept limits (:mod:`tidings.config.listener`): one shape in every
section that configures a listener, its defaults, the rules it gives a listener, and a bad
value refused with a message naming its key."""

from __future__ import annotations

from typing import Any

import pytest

from tidings.accept import AcceptRules
from tidings.config import IntermediaryLimitsConfig, load_config
from tidings.config.listener import ListenerLimitsConfig
from tidings.config.server import EventerServerConfig, SyncerServerConfig, load_server_config
from tidings.config.streams import StreamConfig
from tidings.errors import ConfigError


def _server(**eventer: Any) -> dict[str, Any]:
    return {
        "type": "event",
        "backend": {"module": "tidings.server.backends.sqlite", "db_path": "e.db"},
        "engine": {"server_id": 1},
        "eventer_server": eventer,
    }


@pytest.mark.parametrize(
    "section", [EventerServerConfig, SyncerServerConfig, StreamConfig, IntermediaryLimitsConfig]
)
def test_every_listener_section_has_the_same_keys(section: type) -> None:
    assert issubclass(section, ListenerLimitsConfig)


def test_the_defaults_bound_every_address_and_time_the_handshake() -> None:
    eventer = load_server_config(_server()).eventer_server
    assert eventer.max_connections_per_address == 100
    assert eventer.tls_handshake_timeout.total_seconds() == 10
    assert eventer.accept_rules(tls=True) == AcceptRules(100, 10.0)
    assert eventer.accept_rules(tls=False) == AcceptRules(100, None)  # no wait in plaintext
    limits = load_config({"intermediary": {}}).intermediary
    assert limits is not None and limits.limits.tls_handshake_timeout.total_seconds() == 10


def test_values_are_read_and_null_lifts_the_bound() -> None:
    eventer = load_server_config(
        _server(max_connections_per_address=None, tls_handshake_timeout="250ms")
    ).eventer_server
    assert eventer.accept_rules(tls=True) == AcceptRules(None, 0.25)


@pytest.mark.parametrize(
    ("eventer", "message"),
    [
        ({"max_connections_per_address": 0}, "eventer_server.max_connections_per_address"),
        ({"max_connections_per_address": "many"}, "eventer_server.max_connections_per_address"),
        ({"tls_handshake_timeout": "0s"}, "eventer_server.tls_handshake_timeout"),
        ({"tls_handshake_timeout": "1h"}, "eventer_server.tls_handshake_timeout"),
        ({"tls_handshake_timeout": "soon"}, "eventer_server.tls_handshake_timeout"),
    ],
)
def test_a_bad_value_is_refused_naming_its_key(eventer: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_server_config(_server(**eventer))
