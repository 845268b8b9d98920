"""``tidings consume`` ends with one line and exit 2 where waiting would mislead: a stream it
never reaches (refused, or never answering), a URL that is not a stream's WebSocket, a
``--want`` of types the stream does not carry (refused by the server with the types it
carries). Real sockets, a real server."""

from __future__ import annotations

import os
import re
import socket
import subprocess

import pytest

from bench.harness.processes import free_port
from tests.support.certificates import TlsSetup
from tests.support.cli_runs import one_error_line, run_tidings
from tests.support.stream_helpers import (
    BILLING,
    BILLING_PASSWORD,
    PASSWORD,
    USER,
    access_config,
    serving_in_thread,
    stream_server_config,
)

pytestmark = pytest.mark.sockets

ENV = os.environ | {"TIDINGS_STREAM_USER": USER, "TIDINGS_STREAM_PASSWORD": PASSWORD}


def _consume(*args: str) -> subprocess.CompletedProcess[str]:
    return run_tidings("consume", *args, env=ENV, timeout=60)


@pytest.mark.parametrize("mode", [[], ["--poll"]], ids=["push", "poll"])
def test_a_stream_never_reached_is_one_line_after_the_connect_timeout(mode: list[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/evt"  # nobody listens there
    line = one_error_line(_consume(url, "C", "--connect-timeout", "1", *mode))
    assert line == f"error: cannot reach stream {url}: connection refused"


def test_a_group_never_reached_names_every_url() -> None:
    urls = [f"http://127.0.0.1:{free_port()}/evt" for _ in range(2)]  # nobody listens there
    line = one_error_line(_consume(",".join(urls), "C", "--connect-timeout", "1"))
    assert line == f"error: cannot reach stream {urls[0]} nor {urls[1]}: connection refused"


def test_push_to_a_path_that_is_no_stream_names_the_http_answer(tmp_path) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db")
    with serving_in_thread(config) as server:
        wrong = server.url.replace("/evt", "/nowhere")
        line = one_error_line(_consume(wrong, "C"))
    assert re.search(r"HTTP 4\d\d, not a stream's WebSocket endpoint", line)  # Starlette: 403
    assert "ws://" in line and "/nowhere" in line


@pytest.mark.parametrize("mode", [[], ["--poll"]], ids=["push", "poll"])
@pytest.mark.parametrize(
    ("want", "unknown"),
    [("NOPE,NEVER", "NOPE, NEVER"), ("ORDER,NOPE", "NOPE")],
    ids=["none", "one"],
)
def test_want_of_types_the_stream_does_not_carry_is_refused_naming_those_it_does(
    tmp_path, mode: list[str], want: str, unknown: str
) -> None:
    """A mistyped name among good ones too: the consumer would wait for it in silence."""
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db")
    with serving_in_thread(config) as server:
        line = one_error_line(_consume(server.url, "C", "--want", want, *mode))
        carried = ", ".join(server.config.streams[0].types)
    assert line == (
        f"error: InvalidRequest: want: stream 's' does not carry {unknown} "
        f"(it carries {carried}; null wants them all)"
    )


@pytest.mark.parametrize("mode", [[], ["--poll"]], ids=["push", "poll"])
def test_a_server_that_accepts_but_never_answers_is_given_up_on_at_the_connect_timeout(
    mode: list[str],
) -> None:
    """A real socket that listens and never answers (the kernel completes the handshake):
    the HTTP and WebSocket clients' own timeouts (30 s, 10 s) must not outlast the option."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/evt"
        line = one_error_line(_consume(url, "C", "--connect-timeout", "1", *mode))
    assert line == f"error: cannot reach stream {url}: no answer within 1 s"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:99999/evt", "Port out of range 0-65535"),
        ("http://[::1/evt", "Invalid IPv6 URL"),
        ("http://:8090/evt", "it names no host"),
        ("ftp://127.0.0.1/evt", "its scheme must be http, https, ws or wss"),
    ],
    ids=["port", "bracket", "host", "scheme"],
)
@pytest.mark.parametrize("mode", [[], ["--poll"]], ids=["push", "poll"])
def test_a_malformed_url_is_one_line_naming_what_is_wrong(
    url: str, why: str, mode: list[str]
) -> None:
    line = one_error_line(_consume(url, "C", *mode))
    assert line == f"error: InvalidRequest: {url!r} is not a stream URL: {why}"


@pytest.mark.parametrize("mode", [[], ["--poll"]], ids=["push", "poll"])
def test_https_to_a_plain_http_stream_names_the_failed_tls_handshake(
    tmp_path, mode: list[str]
) -> None:
    config = stream_server_config(f"sqlite:///{tmp_path}/e.db")
    with serving_in_thread(config) as server:
        url = server.url.replace("http://", "https://")
        line = one_error_line(_consume(url, "C", "--connect-timeout", "1", *mode))
    assert line.startswith(f"error: cannot reach stream {url}: TLS handshake failed: [SSL: ")


@pytest.mark.parametrize("mode", [[], ["--poll"]], ids=["push", "poll"])
def test_a_component_the_user_may_not_consume_as_is_one_line_naming_both(
    tmp_path, mode: list[str]
) -> None:
    """Retrying cannot give a user a permission: the refusal ends the consumer at once."""
    config = access_config(f"sqlite:///{tmp_path}/e.db")
    env = os.environ | {"TIDINGS_STREAM_USER": BILLING, "TIDINGS_STREAM_PASSWORD": BILLING_PASSWORD}
    with serving_in_thread(config) as server:
        done = run_tidings("consume", server.url, "AUDITOR", *mode, env=env, timeout=60)
    assert one_error_line(done) == (
        "error: Unauthorized: user 'billing' may not consume stream 's' as component AUDITOR"
    )


@pytest.mark.parametrize("mode", [[], ["--poll"]], ids=["push", "poll"])
def test_an_https_stream_is_verified_against_the_tls_ca_file(tmp_path, mode: list[str]) -> None:
    """With the stream's CA the consumer gets through TLS to the stream (here to its refusal
    of a wrong password); without it the system's CAs refuse the certificate; a CA file that
    is not one is one line naming it."""
    tls = TlsSetup(tmp_path / "tls")
    config = stream_server_config(
        f"sqlite:///{tmp_path}/e.db",
        tls_certfile=str(tls.server.cert),
        tls_keyfile=str(tls.server.key),
    )
    wrong = os.environ | {"TIDINGS_STREAM_USER": USER, "TIDINGS_STREAM_PASSWORD": "wrong"}
    with serving_in_thread(config) as server:
        url = server.url.replace("http://", "https://")
        args = ("consume", url, "C", "--connect-timeout", "5", *mode)
        verified = run_tidings(*args, "--tls-ca-file", str(tls.ca.cert), env=wrong, timeout=60)
        assert one_error_line(verified).startswith("error: SecurityError")
        unverified = one_error_line(_consume(url, "C", "--connect-timeout", "1", *mode))
        assert "certificate verify failed" in unverified
        (tmp_path / "no-ca.pem").write_text("not a certificate")
        bad = run_tidings(*args, "--tls-ca-file", str(tmp_path / "no-ca.pem"), env=wrong)
        assert "no-ca.pem" in one_error_line(bad) and "not a PEM CA certificate" in bad.stderr
