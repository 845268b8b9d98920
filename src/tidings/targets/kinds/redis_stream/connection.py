"""The Redis Streams target's redis-py client: its server, ACL user, TLS, and no retries.

redis-py itself is imported inside the functions: the target registry imports every
module of the kinds, and a process that only validates configurations (every Spark worker
does) must not load it.
"""

from __future__ import annotations

import functools
import ssl
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from tidings.config.tls import TlsClientConfig
from tidings.errors import TargetError, TlsError
from tidings.targets.kinds.redis_stream.config import RedisStreamTargetConfig
from tidings.targets.secrets import secret_from_env

if TYPE_CHECKING:
    import redis


@functools.cache
def _context_connection() -> type[Any]:
    """redis-py's TLS connection class, wrapped with tidings' own context (built once)."""
    from redis.connection import SSLConnection

    class _ContextConnection(SSLConnection):
        """redis-py's TLS connection wrapped with the context tidings builds from its ``tls``
        settings (:meth:`~tidings.config.tls.TlsClientConfig.context`), so that every TLS link
        of tidings verifies alike; redis-py would build its own from loose options.

        It overrides redis-py's ``_wrap_socket_with_ssl`` (redis 8.1); the TLS tests fail if a
        later release renames it.
        """

        def __init__(
            self, tidings_context: ssl.SSLContext, tidings_server_name: str, **kwargs: Any
        ) -> None:
            self._tidings_context = tidings_context
            self._tidings_server_name = tidings_server_name
            super().__init__(**kwargs)

        def _wrap_socket_with_ssl(self, sock: Any) -> ssl.SSLSocket:
            return self._tidings_context.wrap_socket(
                sock, server_hostname=self._tidings_server_name
            )

    return _ContextConnection


def open_client(name: str, config: RedisStreamTargetConfig) -> redis.Redis:
    """A client of ``config``'s server (it connects on its first command): the ACL user and
    its password from the environment, TLS for ``rediss://``, and redis-py's retries off
    (see :mod:`tidings.targets.kinds.redis_stream.target`). A TargetError if the password's
    variable is not set or the TLS files cannot be loaded."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    parts = urlsplit(config.url)
    timeout = config.timeout.total_seconds()
    options: dict[str, Any] = {
        "host": parts.hostname,
        "port": parts.port or 6379,
        "db": int(parts.path.strip("/") or 0),
        "username": config.username,
        "password": secret_from_env("password_env", config.password_env),
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
        "client_name": f"tidings-{name}",
    }
    if config.secure:
        tls = config.tls or TlsClientConfig()  # rediss:// alone: the system's CAs
        try:
            context = tls.context()
        except TlsError as exc:
            raise TargetError(f"cannot load the TLS files: {exc}") from None
        options["connection_class"] = _context_connection()
        options["tidings_context"] = context
        options["tidings_server_name"] = tls.server_name or parts.hostname
    return redis.Redis(connection_pool=redis.ConnectionPool(**options))
