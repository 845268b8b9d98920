"""The configuration of a webhook target: its URL, CloudEvents mode, headers, timeouts, TLS,
retries and concurrency.

Checked when the configuration is read: a URL (or URL template) that is not an absolute
``http``/``https`` URL, credentials written into it, a secret-looking header in ``headers``
(it belongs in ``headers_env``), TLS settings on a plain ``http`` URL. The variables of
``headers_env`` are read at the target's first publish, in the process that publishes (see
:meth:`WebhookTargetConfig.auth_headers`), as the servers read their ``*_env`` secrets when
they start.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from tidings.config import HOUR, SECOND, ZERO, Duration, TargetConfig, parsed_durations, within
from tidings.config.tls import TlsClientConfig
from tidings.errors import ConfigError
from tidings.redaction import secret_name
from tidings.targets.destination import DestinationTemplate

#: An HTTP header name (RFC 9110's ``token``).
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
#: What a URL template's placeholder value may hold: RFC 3986's unreserved characters, so a
#: value can neither add a path segment nor a query, nor need escaping.
_UNRESERVED = re.compile(r"^[A-Za-z0-9._~-]+$")
#: Header names that carry credentials whatever their wording.
_AUTH_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
#: Headers the target sets itself (CloudEvents attributes, the body's type and length).
_OWN_HEADERS = frozenset({"content-type", "content-length", "host", "transfer-encoding"})


def url_value_problem(value: str) -> str | None:
    """Why a placeholder's value cannot stand in a URL (None if it can).

    Values are used as they are, never escaped: an escaped ``/`` or ``?`` would reach a
    server that decodes it before routing, and two values would meet at one endpoint.
    """
    if not _UNRESERVED.fullmatch(value):
        return "a URL template's value must be letters, digits, '-', '.', '_' or '~' (not empty)"
    if value in (".", ".."):
        return "'.' and '..' would change the URL's path"
    return None


def url_template(text: str) -> DestinationTemplate:
    """A ``url`` parsed as a template with the URL value rule (ValueError if it is bad)."""
    return DestinationTemplate(text, url_value_problem)


def _header_name(name: str) -> str:
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"{name!r} is not an HTTP header name")
    if name.lower() in _OWN_HEADERS or name.lower().startswith("ce-"):
        raise ValueError(f"header {name!r} is set by the target itself")
    return name


class WebhookTargetConfig(TargetConfig):
    """An HTTP endpoint every event is POSTed to as a CloudEvent (``url`` may be a template)."""

    kind: Literal["webhook"] = Field(description="The target's kind: ``webhook``.")
    url: str = Field(
        description=(
            "The endpoint, ``http://`` or ``https://``; it may hold placeholders, e.g. "
            "``https://hooks.example.com/orders/{partition_key}``, each filled with a value of "
            "letters, digits, ``-``, ``.``, ``_`` or ``~``."
        ),
    )
    mode: Literal["binary", "structured"] = Field(
        default="binary",
        description=(
            "CloudEvents HTTP content mode: ``binary`` (attributes as ``ce-*`` headers, the "
            "body is the data) or ``structured`` (the body is the whole event, "
            "``application/cloudevents+json``)."
        ),
    )
    source: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "The CloudEvents ``source`` of every event; default: the event's own (its "
            "originator), else ``tidings``."
        ),
    )
    idempotency_header: str = Field(
        default="Idempotency-Key",
        description=(
            "The header that carries the event id, by which receivers drop a re-sent event."
        ),
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Fixed headers of every request (no credentials: those go in ``headers_env``)."
        ),
    )
    headers_env: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Header name -> the environment variable holding its whole value, e.g. "
            "``{Authorization: ORDERS_HOOK_AUTH}`` with ``Bearer ...`` in the variable; read "
            "when the relay first publishes, never written in the file."
        ),
    )
    timeout: Annotated[Duration, within(ZERO, HOUR)] = Field(
        default=timedelta(seconds=10),
        description=(
            "How long a request may take to be written and answered; longer is the endpoint "
            "being unavailable."
        ),
    )
    connect_timeout: Annotated[Duration, within(ZERO, 10 * 60 * SECOND)] = Field(
        default=timedelta(seconds=5), description="How long connecting may take."
    )
    tls: TlsClientConfig | None = Field(
        default=None,
        description=(
            "TLS to an ``https`` endpoint: the CA that signed its certificate (absent: the "
            "system's CAs), a client certificate, ``verify: false``; None: the system's CAs."
        ),
    )
    max_concurrency: int = Field(
        default=16,
        ge=1,
        le=1024,
        description=(
            "Requests in flight at once per endpoint (scheme, host and port) in one process."
        ),
    )
    retries: int = Field(
        default=3,
        ge=0,
        le=20,
        description=(
            "How many times a request answered 408, 429 or 5xx is sent again within the call "
            "before the event fails (the relay's retry policy takes over from there)."
        ),
    )
    retry_backoff: Annotated[Duration, within(ZERO, HOUR, zero=True)] = Field(
        default=timedelta(milliseconds=200),
        description=(
            "The wait before the first of those retries, doubled for each next one, unless "
            "the answer's ``Retry-After`` asks for longer."
        ),
    )
    max_retry_after: Annotated[Duration, within(ZERO, HOUR, zero=True)] = Field(
        default=timedelta(seconds=30),
        description=(
            "The longest wait within a call; an answer whose ``Retry-After`` asks for longer "
            "fails the event at once with that wait in its error."
        ),
    )
    max_body_bytes: int | None = Field(
        default=None,
        ge=1,
        description=(
            "The largest body the endpoint accepts, if known: a larger event is refused at emit "
            "(None: the endpoint's 413 refuses it)."
        ),
    )

    _durations = parsed_durations("timeout", "connect_timeout", "retry_backoff", "max_retry_after")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        shape = url_template(v).literal_shape("x")
        try:
            parts = urlsplit(shape)
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as exc:
            raise ValueError(f"{v!r} is not a URL: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{v!r} is not an absolute http:// or https:// URL")
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                "the URL holds credentials: put them in a header read from the environment "
                "(headers_env), never in the file"
            )
        if parts.fragment:
            raise ValueError(f"{v!r} has a fragment (#...), which is never sent")
        return v

    @field_validator("idempotency_header")
    @classmethod
    def _idempotency_header(cls, v: str) -> str:
        return _header_name(v)

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            _header_name(name)
            if name.lower() in _AUTH_HEADERS or secret_name(name):
                raise ValueError(
                    f"header {name!r} looks like a credential: give it in headers_env (the "
                    "variable holding its value), never in the file"
                )
            if _bad_value(value):
                raise ValueError(f"header {name!r}: a value cannot hold line breaks or controls")
        return v

    @field_validator("headers_env")
    @classmethod
    def _headers_env(cls, v: dict[str, str]) -> dict[str, str]:
        for name, variable in v.items():
            _header_name(name)
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable):
                raise ValueError(f"headers_env.{name}: {variable!r} is not a variable name")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> WebhookTargetConfig:
        lowered = [n.lower() for n in (*self.headers, *self.headers_env, self.idempotency_header)]
        if len(set(lowered)) != len(lowered):
            raise ValueError(
                "a header is given twice (headers, headers_env and idempotency_header share "
                "one space of names, in any letter case)"
            )
        if self.tls is not None and not self.url.lower().startswith("https:"):
            raise ValueError("tls is set but the url is not https://")
        return self

    def auth_headers(self, where: str) -> dict[str, str]:
        """The ``headers_env`` headers with their values read from the environment now;
        ConfigError naming ``where``, the header and the variable (never a value)."""
        found: dict[str, str] = {}
        for name, variable in self.headers_env.items():
            value = os.environ.get(variable)
            if not value:
                raise ConfigError(f"{where}.headers_env.{name}: the variable {variable} is not set")
            if _bad_value(value):
                raise ConfigError(
                    f"{where}.headers_env.{name}: the variable {variable} holds line breaks "
                    "or control characters, which a header cannot"
                )
            found[name] = value
        return found


def _bad_value(value: str) -> bool:
    return any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in value)
