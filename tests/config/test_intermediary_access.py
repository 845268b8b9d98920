"""Who may subscribe to an intermediary, as configured: subscribers with hashed tokens and
passwords (never in clear), grants whose tables must exist, anonymous clients allowed from
loopback by default, and hashes from the environment read at start, named when missing."""

from __future__ import annotations

from typing import Any

import pytest

from tidings.config import load_config
from tidings.config.passwords import hash_password, hash_token, new_token, token_digest
from tidings.errors import ConfigError
from tidings.intermediary.serving.access import Gatekeeper

TOKEN = new_token()
TABLES = {"users": {"columns": {"id": "integer", "name": "text"}, "keyed_by": "id"}}


def _intermediary(**section: Any) -> Any:
    return load_config({"intermediary": {"tables": TABLES, **section}}).intermediary


def test_the_defaults_let_anonymous_clients_in_from_loopback_only_granted_everything() -> None:
    section = _intermediary()
    assert section.subscribers == {} and section.tls is None
    assert section.anonymous.allowed_from == "loopback"
    assert (section.anonymous.events, section.anonymous.tables) == ([["*"]], ["*"])
    assert section.anonymous.regions == "*"


def test_a_subscriber_holds_hashes_and_a_grant_of_nothing_unless_given() -> None:
    section = _intermediary(
        subscribers={
            "dash": {"token_hash": hash_token(TOKEN), "tables": ["users"]},
            "ops": {"password_hash": hash_password("pw", n=2**4), "events": [["app", "*"]]},
        }
    )
    dash, ops = section.subscribers["dash"], section.subscribers["ops"]
    assert dash.token_digest_of("subscribers.dash") == token_digest(TOKEN)
    assert (dash.events, dash.regions) == ([], [])
    assert ops.patterns() == (("app", "*"),) and ops.tables == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({}, "give a token .* or a password"),
        ({"tables": ["users"]}, "give a token"),
        ({"token_hash": TOKEN}, r"a token hash must be sha256\$"),
        ({"password_hash": "s3cret"}, "a password hash must be scrypt"),
        ({"token": TOKEN}, "unknown key"),
        ({"password": "s3cret"}, "unknown key"),
        ({"token_hash_env": "A", "token_hash": hash_token(TOKEN)}, "not both"),
        ({"token_hash_env": "A", "tables": ["nope"]}, r"tables: 'nope' is not a table"),
        ({"token_hash_env": "A", "events": [["*", "x"]]}, "'\\*' is allowed only as the last"),
        ({"token_hash_env": "A", "regions": [{"lo": [0, 0], "hi": [0, 1]}]}, "finite lo < hi"),
        ({"token_hash_env": "A", "regions": "all"}, "regions"),
    ],
)
def test_a_bad_subscriber_is_refused_naming_its_key(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        _intermediary(subscribers={"dash": entry})
    assert "intermediary" in str(caught.value)
    assert TOKEN not in str(caught.value) and "s3cret" not in str(caught.value)


@pytest.mark.parametrize("name", ["anonymous", "a:b", "-x", "", "a b", "x" * 65])
def test_a_subscriber_name_that_could_be_confused_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="subscriber name"):
        _intermediary(subscribers={name: {"token_hash_env": "A"}})


def test_hashes_from_the_environment_are_read_at_start_and_a_missing_one_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    section = _intermediary(
        subscribers={"dash": {"token_hash_env": "DASH_TOKEN_HASH", "tables": ["*"]}}
    )
    monkeypatch.delenv("DASH_TOKEN_HASH", raising=False)
    with pytest.raises(ConfigError, match=r"subscribers.dash.token_hash_env: .*DASH_TOKEN_HASH"):
        Gatekeeper.from_config(section)
    monkeypatch.setenv("DASH_TOKEN_HASH", "sha256$" + "ab" * 32)
    assert Gatekeeper.from_config(section) is not None
    monkeypatch.setenv("DASH_TOKEN_HASH", TOKEN)  # the token itself, by mistake
    with pytest.raises(ConfigError, match=r"DASH_TOKEN_HASH.*a token hash must be") as caught:
        Gatekeeper.from_config(section)
    assert TOKEN not in str(caught.value)


def test_a_tier_takes_the_same_keys_and_refuses_peer_tls_without_tls() -> None:
    spatial = {"upstream": "ws://127.0.0.1:8200/", "world_lo": [0, 0], "world_hi": [9, 9]}
    tier = {"members": ["127.0.0.1:8301"], "spatial": spatial}
    loaded = load_config(
        {
            "intermediary_tiers": {
                "w": tier
                | {
                    "anonymous": {"allowed_from": "nowhere"},
                    "subscribers": {
                        "map": {"token_hash": hash_token(TOKEN), "regions": [{"lo": [0, 0],
                                                                             "hi": [5, 5]}]}
                    },
                }
            }
        }
    )  # fmt: skip
    assert loaded.intermediary_tiers["w"].anonymous.allowed_from == "nowhere"
    with pytest.raises(ConfigError, match="peer_tls: the members serve plaintext"):
        load_config({"intermediary_tiers": {"w": tier | {"peer_tls": {"verify": False}}}})
    with pytest.raises(ConfigError, match="tables: 'users' is not a table"):
        load_config(
            {
                "intermediary_tiers": {
                    "w": tier | {"subscribers": {"m": {"token_hash_env": "A", "tables": ["users"]}}}
                }
            }
        )


def test_a_spatial_upstream_takes_tls_only_over_wss(tls_files: dict[str, str]) -> None:
    spatial = {"upstream": "ws://127.0.0.1:8200/", "world_lo": [0, 0], "world_hi": [9, 9]}
    with pytest.raises(
        ConfigError, match=r"tls: the upstream ws://127\.0\.0\.1:8200/ is not wss://"
    ):
        _intermediary(spatial=spatial | {"tls": {"ca_file": tls_files["ca.pem"]}})
    secure = spatial | {
        "upstream": "wss://127.0.0.1:8200/",
        "tls": {"ca_file": tls_files["ca.pem"]},
    }
    assert _intermediary(spatial=secure).spatial.connect_options()["ssl"].check_hostname
    assert _intermediary(spatial=spatial).spatial.connect_options() == {}
