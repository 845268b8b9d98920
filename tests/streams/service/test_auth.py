"""FTN8 basic authentication of stream callers, and the password hashes it checks against."""

from __future__ import annotations

import pytest

from tests.support.stream_helpers import PASSWORD, PASSWORD_HASH, USER
from tidings.config.passwords import hash_password
from tidings.errors import ConfigError, StreamError
from tidings.streams.service.auth import Users


def test_basic_authentication() -> None:
    users = Users({USER: PASSWORD_HASH})
    assert users.authenticate(f"{USER}:{PASSWORD}") == USER
    assert users.authenticate(f"{USER}:{PASSWORD}") == USER  # the remembered pair
    for sec, reason in [
        (f"{USER}:wrong", "Verification Failed"),
        (f"nobody:{PASSWORD}", "Verification Failed"),
        (None, "Anonymous"),
        ("no-colon", "basic"),
        (f"-hmac:{USER}:x", "basic"),
    ]:
        with pytest.raises(StreamError, match=reason) as caught:
            users.authenticate(sec)
        assert caught.value.name == "SecurityError"
    assert hash_password("x", n=2**4) != hash_password("x", n=2**4)  # salted
    with pytest.raises(ConfigError):
        hash_password("")
