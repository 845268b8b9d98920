"""Addresses: which peers count as this machine (the anonymous-on-loopback defaults)."""

from __future__ import annotations

import pytest

from tidings.address import is_loopback


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),  # an IPv4 peer on a dual-stack socket
        ("::ffff:10.0.0.1", False),
        ("10.0.0.1", False),
        ("fe80::1%eth0", False),
        ("localhost", False),  # a name is not an address a socket reports
        ("", False),
        (None, False),
    ],
)
def test_loopback_peers(host: str | None, local: bool) -> None:
    assert is_loopback(host) is local
