"""Headless Chromium driven over the DevTools protocol, for the tests of tidings' web pages.

Debian's ``chromium`` (``scripts/setup.sh --dev`` installs it) runs with
``--remote-debugging-port=0``: it writes the port it chose to ``DevToolsActivePort`` in its
profile directory, and the browser's DevTools WebSocket is driven with the ``websockets``
library already in the venv, in flat session mode (one connection; a command for a page
carries the page's ``sessionId``). No test framework for browsers is needed for reading a
page's state, its DOM and a screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import websockets

CHROMIUM = Path("/usr/bin/chromium")
#: How long Chromium may take to start, and any one command to answer (a bound, so a broken
#: build fails rather than hangs; the machine is small and shared).
WAIT_S = 60.0


def _spki(certificate: str) -> str:
    """The base64 SHA-256 of a certificate's public key (SubjectPublicKeyInfo, DER)."""
    key = subprocess.run(
        ["openssl", "x509", "-in", certificate, "-pubkey", "-noout"],
        check=True,
        capture_output=True,
    ).stdout
    der = subprocess.run(
        ["openssl", "pkey", "-pubin", "-outform", "der"], input=key, check=True, capture_output=True
    ).stdout
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


class BrowserError(Exception):
    """The browser refused a command, or a page's script threw."""


class Page:
    """One tab, attached by session."""

    def __init__(self, browser: Browser, target_id: str, session_id: str) -> None:
        self.browser = browser
        self.target_id = target_id
        self.session_id = session_id

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable values)."""
        result = await self.browser.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            self.session_id,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise BrowserError(f"page script threw: {text}")
        return result["result"].get("value")

    async def wait_for(self, expression: str) -> Any:
        """The first truthy value of ``expression``, polled (bounded by the caller)."""
        while not (value := await self.evaluate(expression)):
            await asyncio.sleep(0.05)
        return value

    async def screenshot(self, path: Path) -> bytes:
        """A PNG of the page, also written to ``path``."""
        result = await self.browser.call(
            "Page.captureScreenshot", {"format": "png"}, self.session_id
        )
        png = base64.b64decode(result["data"])
        path.write_bytes(png)
        return png

    async def close(self) -> None:
        await self.browser.call("Target.closeTarget", {"targetId": self.target_id})


class Browser:
    """A headless Chromium process and its DevTools connection; use :meth:`start`."""

    def __init__(self, process: asyncio.subprocess.Process, websocket: Any) -> None:
        self.process = process
        self.websocket = websocket
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(
        cls, profile: Path, *, width: int = 800, height: int = 600, trust: str | None = None
    ) -> Browser:
        """Start Chromium with a fresh profile directory ``profile``; a missing Chromium fails
        the test saying how to install it. ``trust``: a server certificate (PEM) whose key
        Chromium accepts over HTTPS and WSS, as if a CA it knows had signed it (its
        ``--ignore-certificate-errors-spki-list``: that key only, every other certificate
        still checked)."""
        if not CHROMIUM.exists():
            pytest.fail(
                f"Chromium is missing ({CHROMIUM}): the web page tests need it; "
                "`bash scripts/setup.sh --dev` installs it (apt-get install chromium)"
            )
        profile.mkdir(parents=True, exist_ok=True)
        port_file = profile / "DevToolsActivePort"
        port_file.unlink(missing_ok=True)  # a previous run's
        log = (profile / "chromium.log").open("wb")
        process = await asyncio.create_subprocess_exec(
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            f"--window-size={width},{height}",
            *([] if trust is None else [f"--ignore-certificate-errors-spki-list={_spki(trust)}"]),
            "about:blank",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        log.close()
        try:
            async with asyncio.timeout(WAIT_S):
                while not port_file.exists() or len(port_file.read_text().split()) < 2:
                    if process.returncode is not None:
                        tail = (profile / "chromium.log").read_text(errors="replace")[-2000:]
                        raise BrowserError(f"Chromium exited ({process.returncode}): {tail}")
                    await asyncio.sleep(0.05)
            port, path = port_file.read_text().split()[:2]
            websocket = await websockets.connect(
                f"ws://127.0.0.1:{port}{path}", max_size=64 * 1024 * 1024
            )
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise
        return cls(process, websocket)

    async def call(
        self, method: str, params: dict[str, Any] | None = None, session_id: str | None = None
    ) -> dict[str, Any]:
        """One DevTools command and its result."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session_id is not None:
            message["sessionId"] = session_id
        future = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        await self.websocket.send(json.dumps(message))
        async with asyncio.timeout(WAIT_S):
            reply = await future
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply["result"]

    async def open(self, url: str) -> Page:
        """A new tab showing ``url``, once its document is parsed (a script may still be
        starting)."""
        target = await self.call("Target.createTarget", {"url": url})
        attached = await self.call(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self, target["targetId"], attached["sessionId"])
        # Without the fragment: a page may take it away (one that reads credentials there).
        base = url.partition("#")[0]
        loaded = (
            f"location.href.split('#')[0] === {json.dumps(base)} "
            "&& document.readyState !== 'loading'"
        )
        while True:
            try:  # the tab starts on about:blank, whose context the navigation destroys
                if await page.evaluate(loaded):
                    return page
            except BrowserError:
                pass
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.call("Browser.close")
        await self.websocket.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        try:
            async with asyncio.timeout(WAIT_S):
                await self.process.wait()
        except TimeoutError:
            self.process.kill()
            await self.process.wait()

    async def _read(self) -> None:
        try:
            async for message in self.websocket:
                reply = json.loads(message)
                future = self._pending.pop(reply.get("id"), None)  # events have no id
                if future is not None and not future.done():
                    future.set_result(reply)
        except websockets.ConnectionClosed:
            pass  # Chromium exiting: the pending commands fail below
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(BrowserError("the DevTools connection closed"))
