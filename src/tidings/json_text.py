"""A JSON object from a peer, or a :class:`~tidings.errors.ProtocolError` naming the peer.

Every client of tidings (the stream client, the intermediary client) decodes what a server
sends with this one function: a hostile or broken server's reply must become an error the
caller can name and handle, never a ``RecursionError`` (a few KB of ``[[[[`` are enough to
raise one in ``json.loads``) or a value of the wrong shape deep inside the client.
"""

from __future__ import annotations

import json
from typing import Any

from tidings.errors import ProtocolError


def json_object(sender: str, text: str | bytes) -> dict[str, Any]:
    """``text`` decoded as a JSON object; ProtocolError naming ``sender`` when it is not
    JSON, nested deeper than the interpreter can follow, or not an object."""
    try:
        message = json.loads(text)
    except RecursionError:
        raise ProtocolError(f"{sender}: the reply is JSON nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise ProtocolError(f"{sender}: the reply is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"{sender}: the reply is not a JSON object")
    return message
