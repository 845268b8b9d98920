"""Keeping secrets out of everything tidings shows: errors, logs and ``tidings config check``.

A secret is found by where it sits, not by a list of today's keys:

- the value of a key whose name says secret (password, secret, token, key, hash,
  credentials, nkey, seed), unless the name ends in ``_env``/``_file``/``_path``/``_dir``
  (it names where a secret is, not the secret: ``password_hash_env``, ``credentials_file``)
  or is the JetStream target's ``credentials`` or ``nkey`` (a file's path, in NATS's words);
- the password of any URL (``postgresql://user:password@host/db``);
- the value of a substituted variable whose name says secret (``${DB_PASSWORD}``).

:func:`masked` hides them in a configuration shown whole. Errors and logs are cleaned by
:func:`scrub`: every configuration file read (:func:`tidings.config.loading.read_config_data`)
:func:`remember`\\ s its secrets in this process, and the last steps before text leaves the
process (the JSON log formatter, the command line's one-line error, a configuration error)
replace them and any URL's password by ``***``. That net catches what a library puts in its
own messages (a driver echoing a URL, a client naming its server); the code itself never
formats a secret into a message in the first place.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import Any

MASK = "***"
#: A name that says it holds a secret: one of these words as a part of it (``_``, ``-``,
#: ``.`` or a case change separate the parts).
_SECRET_WORD = re.compile(
    r"(?:^|[_.-])(password|passwd|pwd|secret|token|key|apikey|hash|credentials?|creds|nkeys?"
    r"|seed)(?=$|[_.-])",
    re.IGNORECASE,
)
#: ...unless it names a file, a path or the variable a secret is read from...
_NOT_A_SECRET = re.compile(r"[_.-](env|file|path|dir)$", re.IGNORECASE)
#: ...or is one of the keys that hold a file's path under NATS's own names (the JetStream
#: target's ``credentials`` and ``nkey``): the secret is the file, and its path is what an
#: error about it must name.
_FILE_KEYS = frozenset({"credentials", "nkey"})
#: ``scheme://user:password@`` (a URL's password; the user and host stay readable).
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*:)[^/@\s]+@")
#: ``scheme://userinfo@``: a URL's whole credentials (NATS takes a token as the user part).
_URL_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")
#: Remembered secrets shorter than this are not scrubbed from free text: replacing a
#: two-letter token everywhere would mangle every message and hide nothing. (Configuration
#: output masks them whatever their length, by their key.)
MIN_SCRUBBED_CHARS = 6

_remembered: set[str] = set()
#: The remembered secrets, longest first (a longer one may contain a shorter one); replaced
#: whole under the lock, read without it.
_ordered: tuple[str, ...] = ()
_lock = threading.Lock()


def secret_name(name: str) -> bool:
    """Whether a key or variable named ``name`` holds a secret (see the module's rules)."""
    if name.lower() in _FILE_KEYS:
        return False
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return bool(_SECRET_WORD.search(snake)) and not _NOT_A_SECRET.search(snake)


def hide_url_passwords(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _URL_PASSWORD.sub(rf"\g<head>{MASK}@", text) if "://" in text else text


def hide_url_credentials(text: str) -> str:
    """``text`` with the whole user part of every URL in it replaced by ``***``: for URLs
    whose user name may itself be a secret (``nats://TOKEN@host``)."""
    return _URL_USERINFO.sub(rf"\g<head>{MASK}@", text) if "://" in text else text


def shown_url(url: str) -> str:
    """``url`` (or any text) as an error may show it, quoted: URL passwords hidden; text
    that still looks like ``user:password@`` (a URL too malformed to find its password in)
    is not shown at all."""
    hidden = hide_url_passwords(url)
    userinfo, at, _ = hidden.rpartition("@")
    if at and ":" in userinfo and not userinfo.endswith(MASK):
        return "<not shown: it may hold a password>"
    return repr(hidden)


def masked(data: Any, secrets: Iterable[str] = ()) -> Any:
    """``data`` (a configuration as plain data) with its secrets replaced by ``***``:
    values of secret-named keys, URL passwords, and every occurrence of a value in
    ``secrets``."""
    ordered = sorted(set(secrets), key=len, reverse=True)

    def text(value: str) -> str:
        for secret in ordered:
            value = value.replace(secret, MASK)
        return hide_url_passwords(value)

    def walk(node: Any, key: str | None) -> Any:
        if key is not None and secret_name(key) and node not in (None, "", [], {}):
            return MASK
        if isinstance(node, dict):
            return {k: walk(v, str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, None) for v in node]
        return text(node) if isinstance(node, str) else node

    return walk(data, None)


def secrets_in(data: Any) -> set[str]:
    """The secrets ``data`` holds: the scalar values under secret-named keys and the
    passwords of the URLs in its strings."""
    found: set[str] = set()

    def walk(node: Any, secret: bool) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, secret or secret_name(str(key)))
        elif isinstance(node, list):
            for value in node:
                walk(value, secret)
        elif isinstance(node, str):
            if secret:
                found.add(node)
            found.update(_url_password(m) for m in _URL_PASSWORD.finditer(node))
        elif secret and isinstance(node, int | float) and not isinstance(node, bool):
            found.add(str(node))

    walk(data, False)
    return {s for s in found if s}


def _url_password(match: re.Match[str]) -> str:
    return match.group(0)[len(match.group("head")) : -1]


def remember(secrets: Iterable[str]) -> None:
    """Scrub ``secrets`` from everything :func:`scrub` cleans in this process from now on."""
    global _ordered
    with _lock:
        _remembered.update(s for s in secrets if len(s) >= MIN_SCRUBBED_CHARS)
        _ordered = tuple(sorted(_remembered, key=len, reverse=True))


def scrub(text: str) -> str:
    """``text`` with every remembered secret and every URL password replaced by ``***``:
    the last step before an error or a log line leaves the process."""
    for secret in _ordered:
        if secret in text:
            text = text.replace(secret, MASK)
    return hide_url_passwords(text)


__all__ = [
    "MASK",
    "MIN_SCRUBBED_CHARS",
    "hide_url_credentials",
    "hide_url_passwords",
    "masked",
    "remember",
    "scrub",
    "secret_name",
    "secrets_in",
    "shown_url",
]
