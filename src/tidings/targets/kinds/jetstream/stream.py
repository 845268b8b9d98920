"""What the JetStream target needs from its stream, and how it gets it without surprising ops.

The target needs two settings of its stream: subjects that capture every subject it
publishes to, and a ``duplicate_window`` at least as long as its own (the window inside
which a re-published event is recognised by its ``Nats-Msg-Id`` and not stored twice).

``create_stream`` says what the target may do about it:

* ``"if-missing"`` (the default): create the stream (with ``storage``, ``replicas``,
  ``max_age``) only if it does not exist; an existing stream is never changed;
* ``false``: never create, never change;
* ``true``: create if missing, and *update* an existing stream that lacks the target's
  subjects or has a shorter window (subjects added, window raised), logging a WARNING
  naming each change. Nothing else of the stream is touched.

An existing stream that is not changed is checked; a missing setting is logged as a WARNING
(``on_mismatch: warn``) or refuses the connection (``fail``), which the relay reports as
the target being unavailable: the events wait, uncharged, until ops fix the stream.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from tidings.errors import TargetError

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.api import StreamConfig

_log = logging.getLogger(__name__)

CreateStream = bool | Literal["if-missing"]


def subject_covers(pattern: str, subject_filter: str) -> bool:
    """Whether every subject ``subject_filter`` matches is captured by ``pattern``.

    Both may hold NATS wildcards (``*`` one token, ``>`` the rest): a literal token covers
    only itself, ``*`` any one token (and ``*``), ``>`` one or more of anything.
    """
    wanted = subject_filter.split(".")
    tokens = pattern.split(".")
    for n, token in enumerate(tokens):
        if token == ">":
            return len(wanted) > n
        if n >= len(wanted) or wanted[n] == ">":
            return False
        if token != "*" and token != wanted[n]:
            return False
    return len(tokens) == len(wanted)


@dataclass(frozen=True, slots=True)
class StreamNeeds:
    """The stream the target publishes to and what it needs of it.

    ``publishes`` is the subject filter of every subject the target can publish to (what
    must be captured); ``creates`` the subjects it gives a stream it creates.
    """

    stream: str
    publishes: str
    creates: str
    duplicate_window: timedelta
    storage: Literal["file", "memory"] = "file"
    replicas: int = 1
    max_age: timedelta | None = None

    def problems(self, config: StreamConfig) -> list[str]:
        """What ``config`` (an existing stream's) lacks, one clear phrase each."""
        found: list[str] = []
        subjects = config.subjects or [self.stream]
        if not any(subject_covers(s, self.publishes) for s in subjects):
            found.append(
                f"its subjects {subjects} do not capture {self.publishes!r} (add {self.creates!r})"
            )
        window = timedelta(seconds=config.duplicate_window or 0)
        if _nanos(window) < _nanos(self.duplicate_window):
            found.append(
                f"its duplicate_window is {_seconds(window)}, shorter than the target's "
                f"duplicate_window of {_seconds(self.duplicate_window)} (re-published events "
                "older than that would be stored twice)"
            )
        return found


async def ensure_stream(
    js: JetStreamContext,
    needs: StreamNeeds,
    create: CreateStream,
    on_mismatch: Literal["warn", "fail"],
    who: str,
) -> None:
    """Create, update or only check the stream as ``create`` allows (module docstring).

    Raises TargetError for a mismatch under ``on_mismatch="fail"``; a stream whose settings
    cannot be read (no permission for the JetStream API, say) is only logged: the acks
    still say whether each message was stored in the right stream.
    """
    from nats.js.api import StorageType
    from nats.js.errors import NotFoundError

    try:
        info = await js.stream_info(needs.stream)
    except NotFoundError:
        if create is False:
            _mismatch(
                who, needs.stream, ["it does not exist (create_stream is false)"], on_mismatch
            )
            return
        await js.add_stream(
            name=needs.stream,
            subjects=[needs.creates],
            duplicate_window=needs.duplicate_window.total_seconds(),
            storage=StorageType(needs.storage),
            num_replicas=needs.replicas,
            max_age=needs.max_age.total_seconds() if needs.max_age is not None else None,
        )
        _log.info("%s: created stream %r for %r", who, needs.stream, needs.creates)
        return
    except Exception as exc:
        _log.warning(
            "%s: cannot read the settings of stream %r to check them (%s: %s); publishing anyway",
            who,
            needs.stream,
            type(exc).__name__,
            exc,
        )
        return
    problems = needs.problems(info.config)
    if not problems:
        return
    if create is True:
        await _update(js, info.config, needs, who)
    else:
        _mismatch(who, needs.stream, problems, on_mismatch)


async def _update(js: JetStreamContext, config: StreamConfig, needs: StreamNeeds, who: str) -> None:
    """``create_stream: true``: add what is missing, say so, leave everything else."""
    subjects = list(config.subjects or [needs.stream])
    changes: list[str] = []
    if not any(subject_covers(s, needs.publishes) for s in subjects):
        subjects.append(needs.creates)
        changes.append(f"added subject {needs.creates!r}")
    window = config.duplicate_window or 0
    if _nanos(timedelta(seconds=window)) < _nanos(needs.duplicate_window):
        changes.append(
            f"raised duplicate_window from {_seconds(timedelta(seconds=window))} "
            f"to {_seconds(needs.duplicate_window)}"
        )
        window = needs.duplicate_window.total_seconds()
    await js.update_stream(config.evolve(subjects=subjects, duplicate_window=window))
    _log.warning(
        "%s: updated existing stream %r (create_stream is true): %s",
        who,
        needs.stream,
        "; ".join(changes),
    )


def _mismatch(who: str, stream: str, problems: list[str], on_mismatch: str) -> None:
    text = f"stream {stream!r} does not fit: {'; '.join(problems)}"
    if on_mismatch == "fail":
        raise TargetError(f"{text} (on_mismatch is fail: nothing is published until it does)")
    _log.warning("%s: %s (left as it is; on_mismatch is warn)", who, text)


def _nanos(value: timedelta) -> int:
    """JetStream keeps durations in nanoseconds; compare there, not as binary floats."""
    return round(value.total_seconds() * 1e9)


def _seconds(value: timedelta) -> str:
    return f"{value.total_seconds():g}s"
