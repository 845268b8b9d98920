"""Credentials at the handshake, both sides: what a client sends (a header, or subprotocols
for a page) is what the server reads back; malformed ones are refused without being quoted."""

from __future__ import annotations

import base64

import pytest

from tidings.errors import AccessRefused
from tidings.intermediary.serving.credentials import Credentials, presented

TOKEN = "tok-" + "x" * 40
PAIRS = [Credentials(token=TOKEN), Credentials(user="ops", password="pä ss:wörd/+=")]


@pytest.mark.parametrize("credentials", PAIRS, ids=["token", "password"])
def test_what_a_client_sends_the_server_reads_back(credentials: Credentials) -> None:
    headers = {k.lower(): v for k, v in credentials.headers().items()}
    assert presented(headers) == credentials
    offered = ", ".join(["chat", *credentials.subprotocols()])
    assert presented({"sec-websocket-protocol": offered}) == credentials


def test_none_presented_is_anonymous_and_secrets_are_not_in_repr() -> None:
    assert presented({}) is None
    assert presented({"sec-websocket-protocol": "tidings"}) is None
    shown = repr(Credentials(user="ops", password="s3cret")) + repr(Credentials(token=TOKEN))
    assert "s3cret" not in shown and TOKEN not in shown and "ops" in shown


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"authorization": "Digest abc"}, "Authorization: unknown scheme"),
        ({"authorization": "Bearer"}, "Authorization: unknown scheme or empty value"),
        ({"authorization": "Basic !!!not-base64"}, "not base64 of user:password"),
        ({"authorization": "Basic " + base64.b64encode(b"no-colon").decode()}, "not user:pass"),
        ({"authorization": "Bearer " + "y" * 3000}, "too long"),
        ({"sec-websocket-protocol": f"tidings.bearer.{TOKEN}"}, "offer 'tidings'"),
        ({"sec-websocket-protocol": "tidings, tidings.bearer.a, tidings.bearer.b"}, "offer"),
    ],
)
def test_malformed_credentials_are_refused_401_without_quoting_them(
    headers: dict[str, str], message: str
) -> None:
    with pytest.raises(AccessRefused, match=message) as caught:
        presented(headers)
    assert caught.value.status == 401
    secret = headers.get("authorization", "").partition(" ")[2]
    assert TOKEN not in str(caught.value) and (not secret or secret not in str(caught.value))


def test_a_user_name_with_a_colon_cannot_be_sent() -> None:
    with pytest.raises(AccessRefused, match="no ':'"):
        Credentials(user="a:b", password="x")
    with pytest.raises(AccessRefused, match="a token, or a user and a password"):
        Credentials(user="a")
