"""The FTN18 interfaces a stream serves, and the checks of each function's parameters.

Interfaces and versions follow FTN18 v1.1 as the FutoIn client calls them: ``futoin.evt.gen``
(``addEvent``), ``futoin.evt.poll`` (``registerConsumer``, ``pollEvents``),
``futoin.evt.push`` (the poll functions and ``readyToReceive``; it needs a WebSocket) and
``futoin.ping``; every interface also answers ``ping``, which FTN18's interfaces import. A
call may name any minor version up to ours within the same major (FTN3's rule). Parameters
are checked against the FTN18 types before a function runs: unknown or missing ones, and
values of the wrong type, are ``InvalidRequest`` naming the parameter, exactly as FutoIn's
executor answers them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidings.config.stream_types import FTN18_TYPE
from tidings.errors import StreamError
from tidings.streams.protocol.ftn3 import (
    INVALID_REQUEST,
    LIVE_NOT_ALLOWED,
    NOT_REGISTERED,
    NOT_SUPPORTED_VERSION,
    UNKNOWN_INTERFACE,
    Request,
)

#: FTN18 ``EventID``: a positive 64-bit-ish integer written as a string.
EVENT_ID = re.compile(r"^[1-9][0-9]{0,17}$")
#: FTN18 ``ConsumerComponent``.
COMPONENT = re.compile(r"^[A-Za-z0-9_]{1,16}$")
#: The reserved component of live (unregistered, gaps allowed) consumers.
LIVE = "LIVE"
#: The FTN3 ``integer`` the FutoIn client checks: 32-bit signed.
_INT32 = 2**31

GEN = "futoin.evt.gen"
POLL = "futoin.evt.poll"
PUSH = "futoin.evt.push"
PING = "futoin.ping"
RECEIVER = "futoin.evt.receiver"
#: Our version of every FTN18 interface; the 1.0 versions differ only in size limits.
VERSION = (1, 1)
PING_VERSION = (1, 0)
#: Reply size limits: 1.1 declares ``maxrspsize`` 8M for pollEvents (``maxreqsize`` 8M for
#: onEvents); 1.0 declares none, and FTN3's default is 64 KiB.
LARGE_MESSAGE_BYTES = 8 * 1024 * 1024
DEFAULT_MESSAGE_BYTES = 64 * 1024


def message_limit(minor: int) -> int:
    """The largest pollEvents reply (or onEvents request) of interface version ``1.minor``."""
    return LARGE_MESSAGE_BYTES if minor >= 1 else DEFAULT_MESSAGE_BYTES


Check = Callable[[str, Any], Any]


def _component(name: str, value: Any) -> str:
    if not isinstance(value, str) or not COMPONENT.match(value):
        raise _mismatch(name, value, "a component name of 1-16 of A-Z, a-z, 0-9 and _")
    return value


def _event_id_or_null(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, str) or not EVENT_ID.match(value):
        raise _mismatch(name, value, "an event id: a string of 1-18 digits, not starting with 0")
    return int(value)


def _event_type(name: str, value: Any) -> str:
    if not isinstance(value, str) or not FTN18_TYPE.match(value):
        raise _mismatch(name, value, "an event type of 1-16 of A-Z and _")
    return value


def _event_types_or_null(name: str, value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _mismatch(name, value, "a list of event types")
    return [_event_type(f"{name}[{index}]", item) for index, item in enumerate(value)]


def _any(name: str, value: Any) -> Any:
    return value


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT32 <= value < _INT32:
        raise _mismatch(name, value, "a 32-bit integer")
    checked: int = value
    return checked


def _mismatch(name: str, value: Any, expected: str) -> StreamError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return StreamError(
        INVALID_REQUEST, f"Type mismatch for parameter {name}: {shown} is not {expected}"
    )


@dataclass(frozen=True)
class Function:
    """One function: its parameters (name -> check, and whether it has a default of null)
    and the error names it may raise besides the standard ones."""

    params: dict[str, tuple[Check, bool]]
    throws: frozenset[str] = frozenset()

    def check(self, params: dict[str, Any]) -> dict[str, Any]:
        unknown = set(params) - set(self.params)
        if unknown:
            raise StreamError(INVALID_REQUEST, f"Unknown parameter: {', '.join(sorted(unknown))}")
        checked = {}
        for name, (check, optional) in self.params.items():
            if name not in params and not optional:
                raise StreamError(INVALID_REQUEST, f"Missing parameter: {name}")
            checked[name] = check(name, params.get(name))
        return checked


@dataclass(frozen=True)
class Interface:
    """One interface at our version; ``secure`` / ``bidirect`` are FTN3's ``requires``."""

    name: str
    version: tuple[int, int]
    functions: dict[str, Function]
    secure: bool = False
    bidirect: bool = False
    anonymous: bool = False

    def accepts(self, request: Request) -> None:
        """Refuse a request whose version this interface cannot serve."""
        major, minor = self.version
        if request.major != major:
            raise StreamError(
                NOT_SUPPORTED_VERSION, f"{self.name}: major version {request.major} is not {major}"
            )
        if request.minor > minor:
            raise StreamError(
                NOT_SUPPORTED_VERSION,
                f"{self.name}: version {request.major}.{request.minor} is newer than ours "
                f"({major}.{minor})",
            )


PING_FUNCTION = Function({"echo": (_integer, False)})
_REGISTER = Function({"component": (_component, False)}, frozenset({LIVE_NOT_ALLOWED}))
_POLL = Function(
    {
        "component": (_component, False),
        "last_id": (_event_id_or_null, True),
        "want": (_event_types_or_null, True),
    },
    frozenset({NOT_REGISTERED}),
)
_READY = Function(
    {"component": (_component, False), "want": (_event_types_or_null, True)},
    frozenset({NOT_REGISTERED}),
)
_ADD = Function({"type": (_event_type, False), "data": (_any, False)})

INTERFACES: dict[str, Interface] = {
    GEN: Interface(GEN, VERSION, {"addEvent": _ADD, "ping": PING_FUNCTION}, secure=True),
    POLL: Interface(
        POLL,
        VERSION,
        {"registerConsumer": _REGISTER, "pollEvents": _POLL, "ping": PING_FUNCTION},
    ),
    PUSH: Interface(
        PUSH,
        VERSION,
        {
            "registerConsumer": _REGISTER,
            "pollEvents": _POLL,
            "readyToReceive": _READY,
            "ping": PING_FUNCTION,
        },
        bidirect=True,
    ),
    PING: Interface(PING, PING_VERSION, {"ping": PING_FUNCTION}, anonymous=True),
}


def interface_of(request: Request) -> tuple[Interface, Function]:
    """The interface and function a request calls, its version checked."""
    interface = INTERFACES.get(request.iface)
    if interface is None:
        raise StreamError(UNKNOWN_INTERFACE, f"Unknown interface: {request.iface}")
    interface.accepts(request)
    function = interface.functions.get(request.func)
    if function is None:
        raise StreamError(
            INVALID_REQUEST, f"Not implemented function: {request.iface}:{request.func}"
        )
    return interface, function
