"""The ``intermediary:`` section's ``metrics:`` and its limits per client address (issue 30):
the defaults, and a bad value refused with a message naming its key."""

from __future__ import annotations

from typing import Any

import pytest

from tidings.config import IntermediaryConfig, MetricsConfig, load_config
from tidings.config.metrics import MetricsListenConfig
from tidings.errors import ConfigError


def _intermediary(**section: Any) -> IntermediaryConfig:
    return load_config({"intermediary": section}).intermediary


def test_the_defaults_bound_every_address_and_serve_no_metrics() -> None:
    config = _intermediary()
    assert config.metrics.port is None and config.metrics.address == "127.0.0.1"
    limits = config.limits
    assert limits.max_connections_per_address == 100
    assert limits.max_failed_logins == 10
    assert limits.failed_login_window.total_seconds() == 60
    assert limits.failed_login_block.total_seconds() == 60


def test_metrics_and_limits_are_read() -> None:
    config = _intermediary(
        metrics={"port": 9310, "address": "0.0.0.0"},
        limits={
            "max_connections_per_address": 5,
            "max_failed_logins": None,
            "failed_login_window": "30s",
            "failed_login_block": "10m",
        },
    )
    assert (config.metrics.port, config.metrics.address) == (9310, "0.0.0.0")
    assert config.limits.max_connections_per_address == 5
    assert config.limits.max_failed_logins is None
    assert config.limits.failed_login_block.total_seconds() == 600


def test_the_relay_shares_the_endpoint_keys() -> None:
    assert issubclass(MetricsConfig, MetricsListenConfig)
    assert {"port", "address"} <= set(MetricsConfig.model_fields)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"metrics": {"port": 0}}, "intermediary.metrics.port"),
        ({"metrics": {"port": 70000}}, "intermediary.metrics.port"),
        ({"metrics": {"port": 9000, "adress": "x"}}, "intermediary.metrics.adress"),
        ({"metrics": {"address": ""}}, "intermediary.metrics.address"),
        ({"listen": "127.0.0.1:9000", "metrics": {"port": 9000}}, "a port of its own"),
        ({"limits": {"max_connections_per_address": 0}}, "max_connections_per_address"),
        ({"limits": {"max_connections_per_address": "many"}}, "max_connections_per_address"),
        ({"limits": {"max_failed_logins": -1}}, "max_failed_logins"),
        ({"limits": {"failed_login_window": "0s"}}, "failed_login_window"),
        ({"limits": {"failed_login_block": "2d"}}, "failed_login_block"),
        ({"limits": {"failed_login_block": "soon"}}, "failed_login_block"),
    ],
)
def test_a_bad_value_is_refused_naming_its_key(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _intermediary(**section)


def _tier(**settings: object) -> dict[str, object]:
    tier = {
        "members": ["127.0.0.1:8301", "127.0.0.1:8302"],
        "spatial": {"upstream": "ws://127.0.0.1:8200/", "world_lo": [0, 0], "world_hi": [9, 9]},
        **settings,
    }
    return {"intermediary_tiers": {"world": tier}}


def test_a_tier_takes_one_metrics_port_per_member() -> None:
    tier = load_config(_tier(metrics={"port": 9400})).intermediary_tiers["world"]
    assert tier.metrics.port == 9400 and tier.metrics.address == "127.0.0.1"
    with pytest.raises(ConfigError, match=r"take the port of member 127\.0\.0\.1:8302"):
        load_config(_tier(metrics={"port": 8302}))
    with pytest.raises(ConfigError, match="past 65535"):
        load_config(_tier(metrics={"port": 65535}))
