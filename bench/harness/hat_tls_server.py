"""hat-event 0.8.5's own server, given a certificate for its ``ssl+sbs://`` listeners.

hat-event 0.8.5 serves ``ssl+sbs`` addresses through ``hat.chatter.listen``, whose
``pem_file`` argument its Eventer and Syncer servers never pass (its configuration has no
key for one): such a server has no certificate and no TLS client can finish a handshake
with it. This runs the real server (``hat.event.server.main``) with that one argument
filled in from the ``HAT_TLS_PEM`` environment variable (a PEM file holding the
certificate and its key), so the interop tests can meet a hat-event server over TLS.
Nothing else of hat-event is changed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import hat.chatter
from hat.event.server.main import main

_listen = hat.chatter.listen


async def _listen_with_certificate(*args: Any, **kwargs: Any) -> Any:
    kwargs.setdefault("pem_file", os.environ["HAT_TLS_PEM"])
    return await _listen(*args, **kwargs)


hat.chatter.listen = _listen_with_certificate

if __name__ == "__main__":
    sys.argv[0] = "hat-event-server"
    sys.exit(main())
