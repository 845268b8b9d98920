"""The exception hierarchy of tidings.

Every error tidings raises on purpose derives from :class:`TidingsError`, so a caller can
catch the whole family at one edge and still tell the kinds apart.
"""

from __future__ import annotations


class TidingsError(Exception):
    """Base of every error raised by tidings."""


class ConfigError(TidingsError):
    """The configuration is invalid; the message names the offending key and value."""


class EmitError(TidingsError):
    """An event could not be emitted; the surrounding transaction must not commit."""


class SchemaError(TidingsError):
    """The database schema is missing, newer than this library, or cannot be upgraded."""


class TargetError(TidingsError):
    """A target could not be reached or refused an event."""


class RelayError(TidingsError):
    """The relay pipeline could not start or run."""


class ProtocolError(TidingsError):
    """A peer sent bytes that are not a valid message of the protocol; the link is closed."""
