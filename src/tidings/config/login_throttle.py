"""The failed-login throttle's keys (``max_failed_logins``, ``failed_login_window``,
``failed_login_block``), one shape shared by the intermediaries' ``limits:`` and the
console's section, so an operator writes the same three keys wherever people log in.

Kept in a module of its own so a part's section reuses it without importing another part's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from pydantic import Field

from tidings.config.model import DAY, ZERO, Duration, StrictModel, parsed_durations, within


class LoginThrottleConfig(StrictModel):
    """Bounds on one client address's failed logins (a section inherits these keys)."""

    max_failed_logins: int | None = Field(
        default=10,
        gt=0,
        le=1_000_000,
        description=(
            "Refused credentials (a wrong password or token, malformed ones) one client "
            "address may present within ``failed_login_window``; past this every login from "
            "that address (an intermediary's WebSocket handshake, the console's login form) is "
            "answered 429 for ``failed_login_block`` without its credentials being checked (a "
            "password is never hashed for it). null: no throttle."
        ),
    )
    failed_login_window: Annotated[Duration, within(ZERO, DAY)] = Field(
        default=timedelta(minutes=1),
        description="The window ``max_failed_logins`` is counted over, per address.",
    )
    failed_login_block: Annotated[Duration, within(ZERO, DAY)] = Field(
        default=timedelta(minutes=1),
        description="How long an address past ``max_failed_logins`` is refused.",
    )

    _throttle_durations = parsed_durations("failed_login_window", "failed_login_block")
