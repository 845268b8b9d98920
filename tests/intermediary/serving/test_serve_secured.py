"""``tidings intermediary serve`` with TLS and subscribers (issue 30), as an operator runs it:
a real ``tidings server`` and the intermediary in subprocesses, its ``tls:`` and
``subscribers:`` from the file (the token's hash from the environment), a Python subscriber
over ``wss://``, and the /live page over HTTPS in headless Chromium, signing in with a token
in its address's fragment or in its form, and showing a refused table with the server's
reason while its allowed panels go on."""

from __future__ import annotations

import os
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from bench.harness.processes import ServerProcess, free_port, tidings_cli, wait_for_port
from tests.intermediary.serving.test_serve import (
    _next,
    _stop,
    event_server,
    live_panels,
    produce_paid_and_cy,
)
from tests.support.chromium import Browser
from tests.support.waiting import run
from tidings.cli import app
from tidings.config.passwords import MIN_TOKEN_CHARS, hash_token, new_token
from tidings.config.tls import TlsClientConfig
from tidings.errors import AccessRefused, SubscriptionRefused
from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.serving.credentials import Credentials

pytestmark = pytest.mark.sockets

__all__ = ["event_server"]  # the fixture, shared with test_serve

TOKEN = new_token()
TABLES = {
    "users": {"columns": {"id": "integer", "name": "text", "city": "text"}, "keyed_by": "id"},
    "orders": {"columns": {"id": "integer", "amount": "real"}, "keyed_by": "id"},
}


def _serve_secured(
    tmp_path: Path, event_server: ServerProcess, tls_files: dict[str, str]
) -> tuple[int, subprocess.Popen[bytes]]:
    """The intermediary over TLS, admitting "dash" (token; app events and the users table)
    and nobody anonymous; its port and process."""
    port = free_port()
    section = {
        "listen": f"127.0.0.1:{port}",
        "event_server": event_server.eventer,
        "row_type_prefix": ["db"],
        "tables": TABLES,
        "tls": {"cert_file": tls_files["server.pem"], "key_file": tls_files["server.key"]},
        "anonymous": {"allowed_from": "nowhere"},
        "subscribers": {
            "dash": {"token_hash_env": "DASH_TOKEN_HASH", "events": [["app", "*"]],
                     "tables": ["users"]},
        },
    }  # fmt: skip
    path = tmp_path / "tidings.yaml"
    path.write_text(yaml.safe_dump({"intermediary": section}))
    environment = {**os.environ, "DASH_TOKEN_HASH": hash_token(TOKEN)}
    proc = tidings_cli(
        "intermediary", "serve", "-c", str(path),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment,
    )  # fmt: skip
    return port, proc


def test_a_subscriber_over_wss_with_a_token_sees_what_its_grant_allows(
    tmp_path: Path, event_server: ServerProcess, tls_files: dict[str, str]
) -> None:
    port, proc = _serve_secured(tmp_path, event_server, tls_files)
    url = f"wss://127.0.0.1:{port}/"
    trusting = TlsClientConfig(ca_file=tls_files["ca.pem"]).context()

    async def main() -> dict[str, Any]:
        with pytest.raises(AccessRefused, match="anonymous subscribers are not allowed"):
            await IntermediaryClient.connect(url, tls=trusting)
        token = Credentials(token=TOKEN)
        async with await IntermediaryClient.connect(url, credentials=token, tls=trusting) as dash:
            assert dash.identity == "dash"
            await dash.subscribe_events("ev", [["app", "*"]])
            await dash.subscribe_sql("v", "SELECT id, name FROM users")
            with pytest.raises(
                SubscriptionRefused, match="'dash' may not subscribe to table orders"
            ):
                await dash.subscribe_sql("o", "SELECT id FROM orders")
            with pytest.raises(SubscriptionRefused, match=r"'dash' may not subscribe to events \["):
                await dash.subscribe_events("all", [["*"]])
            await produce_paid_and_cy(event_server.eventer)
            return await _next(dash, "event", "ev")

    try:
        wait_for_port(port, 30, process=proc)
        event = run(main(), 60)
    finally:
        out, err = _stop(proc)
    assert event["type"] == ["app", "paid"]
    assert f"intermediary listening on wss://127.0.0.1:{port}/ (page: https://" in out
    assert "subscriber refused at the handshake" in err and TOKEN not in err + out
    assert "Traceback" not in err and '"level": "error"' not in err


async def _the_page(url: str, eventer: str, profile: Path, trust: str, form: bool) -> Any:
    browser = await Browser.start(profile, trust=trust)
    try:
        page = await browser.open(url)
        if form:  # refused without credentials: the reason, and a form for them
            await page.wait_for("document.getElementById('login') !== null")
            reason = await page.evaluate("document.querySelector('#login .reason').textContent")
            assert "anonymous subscribers are not allowed" in reason
            await page.evaluate(
                f"(() => {{ const f = document.getElementById('login');"
                f" f.token.value = {TOKEN!r}; f.requestSubmit(); }})()"
            )
        panels = await live_panels(page, eventer)
        assert await page.evaluate("window.tidingsLive.identity") == "dash"
        assert await page.evaluate("location.hash") == ""  # the token left the address bar
        return panels
    finally:
        await browser.close()


@pytest.mark.parametrize("form", [False, True], ids=["fragment", "form"])
def test_the_live_page_over_https_signs_in_and_shows_a_refused_table(
    tmp_path: Path, event_server: ServerProcess, tls_files: dict[str, str], form: bool
) -> None:
    port, proc = _serve_secured(tmp_path, event_server, tls_files)
    query = urllib.parse.urlencode(
        [
            ("events", "app/*"),
            ("sql", "SELECT id, name FROM users"),
            ("sql", "SELECT id FROM orders"),
        ],
        quote_via=urllib.parse.quote,
    )
    fragment = "" if form else f"#token={TOKEN}"
    url = f"https://127.0.0.1:{port}/live?{query}{fragment}"
    try:
        wait_for_port(port, 30, process=proc)
        panels = run(
            _the_page(
                url, event_server.eventer, tmp_path / "profile", tls_files["server.pem"], form
            ),
            120,
        )
    finally:
        _stop(proc)
    events, view, refused = panels
    assert events["cells"] == ['app/paid {"order":7}']
    assert view["cells"] == ["idname", "3cy"]
    assert refused["state"].startswith("subscriber 'dash' may not subscribe to table orders")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--tls-key-file", "/nowhere.key"], "error: --tls-cert-file: needed with"),
        (["--tls-cert-file", "/nowhere.pem", "--tls-key-file", "/k.pem"], "error: --tls-*: "),
    ],
)
def test_simulate_with_unusable_tls_files_is_one_line_and_exit_2(
    args: list[str], line: str
) -> None:
    result = CliRunner().invoke(app, ["intermediary", "simulate", "--listen", "127.0.0.1:0", *args])
    assert result.exit_code == 2, result.output
    [said] = result.stderr.strip().splitlines()
    assert said.startswith(line) and ("/nowhere" in said or "needed" in said)


def test_new_token_prints_a_token_and_the_hash_a_configuration_takes() -> None:
    result = CliRunner().invoke(app, ["intermediary", "new-token"])
    assert result.exit_code == 0, result.output
    token, digest = result.stdout.split()
    assert len(token) >= MIN_TOKEN_CHARS and digest == hash_token(token)
    assert CliRunner().invoke(app, ["intermediary", "new-token"]).stdout.split()[0] != token
