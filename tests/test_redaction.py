"""Secrets found by where they sit and kept out of what tidings shows (issue 30)."""

from __future__ import annotations

import pytest

from tidings.redaction import (
    MASK,
    hide_url_credentials,
    hide_url_passwords,
    remember,
    scrub,
    secret_name,
    secrets_in,
    shown_url,
)


@pytest.mark.parametrize(
    "name",
    [
        "password",
        "password_hash",
        "syncer_token",
        "apiKey",
        "nkey_seed",
        "user_credentials",
        "DB_PASSWORD",
        "TIDINGS_APP_HASH",
        "seed",
    ],
)
def test_names_that_say_secret(name: str) -> None:
    assert secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "password_hash_env",
        "credentials_file",
        "tls_keyfile",
        "keyed_by",
        "url",
        "tokens_per_s",
        "credentials",  # the JetStream target's: a file's path, in NATS's words
        "nkey",
    ],
)
def test_names_that_only_say_where_a_secret_is_or_nothing(name: str) -> None:
    assert not secret_name(name)


def test_url_passwords_and_credentials_are_hidden_hosts_kept() -> None:
    text = "cannot reach postgresql://app:pw%40x@db:5432/app nor nats://TOKEN123@nats:4222"
    assert hide_url_passwords(text) == (
        f"cannot reach postgresql://app:{MASK}@db:5432/app nor nats://TOKEN123@nats:4222"
    )
    assert hide_url_credentials(text) == (
        f"cannot reach postgresql://{MASK}@db:5432/app nor nats://{MASK}@nats:4222"
    )


def test_a_url_an_error_shows_never_carries_a_password() -> None:
    assert shown_url("postgresql://u:pw@h/db") == f"'postgresql://u:{MASK}@h/db'"
    assert shown_url("sqlite//data.db") == "'sqlite//data.db'"  # a typo stays findable
    # Not a URL the password of which can be found: not shown at all.
    assert "pw" not in shown_url("postgres:/u:pw@h/db")


def test_secrets_in_a_configuration_are_found_by_key_and_url() -> None:
    data = {
        "syncer_token": "tok-abcdef",
        "database": {"url": "postgresql://u:dbpass@h/db"},
        "stream_users": {"app": {"password_hash": "scrypt$1$2$3$x$y", "password_hash_env": "V"}},
        "servers": [{"syncer_peers": [{"syncer_token": "tok-abcdef", "server_id": 2}]}],
        "port": 8090,
    }
    assert secrets_in(data) == {"tok-abcdef", "dbpass", "scrypt$1$2$3$x$y"}


def test_remembered_secrets_are_scrubbed_from_any_text_unless_too_short(
    forgotten_secrets: None,
) -> None:
    remember(["tok-abcdef", "tok-abcdef-longer", "ab"])
    assert scrub("peer sent tok-abcdef-longer, we have tok-abcdef; ab") == (
        f"peer sent {MASK}, we have {MASK}; ab"
    )
    assert scrub("postgresql://u:pw@h/db") == f"postgresql://u:{MASK}@h/db"
