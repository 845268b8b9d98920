"""Secrets a target reads from the environment when it connects, never from its file.

A broker password in ``tidings.yaml`` would be copied wherever the configuration goes (a
Spark job's arguments, a support bundle, ``tidings config show``); naming the environment
variable that holds it keeps the secret with the process. It is read at each connection,
so a rotated secret is used from the next connection on.
"""

from __future__ import annotations

import os

from tidings.errors import TargetError

#: What an environment variable's name may be (POSIX's portable names).
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


def secret_from_env(what: str, name: str | None) -> str | None:
    """The value of environment variable ``name`` (None if no name is configured); a
    TargetError naming ``what`` and the variable if it is not set."""
    if name is None:
        return None
    value = os.environ.get(name)
    if value is None:
        raise TargetError(f"{what}: environment variable {name!r} is not set")
    return value
