"""``tidings events``: the incomplete events, listed, resubmitted, parked and unparked.

The commands are the command-line face of :class:`tidings.outbox.incomplete.IncompleteEvents`
(filters by status, id, type, target, key and age); the routes in force tell which targets
each event is owed to.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_type_hints

import typer

from tidings.cli.common import (
    ConfigOption,
    console,
    err,
    event_ids,
    events_app,
    load_or_exit,
    require_target,
    seconds_option,
)
from tidings.errors import TidingsError

if TYPE_CHECKING:
    from tidings.outbox.incomplete import EventFilter, IncompleteEvents

StatusOption = Annotated[
    list[str] | None,
    typer.Option(
        "--status",
        help="PENDING, HELD, FAILED, PARKED or UNROUTABLE (repeatable).",
        case_sensitive=False,
    ),
]
IdOption = Annotated[list[str] | None, typer.Option("--id", help="An event id (repeatable).")]
TypeOption = Annotated[
    str | None, typer.Option("--type", help="Event type, or a prefix ending in '*'.")
]
TargetOption = Annotated[
    str | None, typer.Option("--target", help="Events this target has not confirmed.")
]
KeyOption = Annotated[str | None, typer.Option("--key", help="Partition key.")]
AgeOption = Annotated[
    str | None, typer.Option("--older-than", help="Logged longer ago than this, e.g. 10m.")
]

#: The options that choose events, by parameter name: every filtering command has them all.
_FILTER_OPTIONS = {
    "statuses": StatusOption,
    "ids": IdOption,
    "event_type": TypeOption,
    "target": TargetOption,
    "key": KeyOption,
    "older_than": AgeOption,
}


def _filtered(command: Callable[..., None]) -> Callable[..., None]:
    """``command(config, *, where, limit, ...)`` as a command with the filter's options in
    place of ``where``: the options are declared once, and the command gets them as one
    :class:`EventFilter` (with its own ``--limit``), checked before it runs."""
    # ``where`` is given here, not by typer: its type (imported for type checkers only)
    # need not resolve at run time.
    hints = get_type_hints(command, localns={"EventFilter": object}, include_extras=True)
    parameters: list[inspect.Parameter] = []
    for parameter in inspect.signature(command).parameters.values():
        if parameter.name == "where":
            parameters += [
                inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=a)
                for name, a in _FILTER_OPTIONS.items()
            ]
        else:
            parameters.append(parameter.replace(annotation=hints[parameter.name]))

    @functools.wraps(command)
    def run(**given: Any) -> None:
        chosen = {name: given.pop(name) for name in _FILTER_OPTIONS}
        command(where=_filter(**chosen, limit=given["limit"]), **given)

    run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in parameters}
    return run


def _incomplete(config: Path | None, target: str | None = None) -> IncompleteEvents:
    """The incomplete events of the configuration; ``target`` (a --target filter) must be
    one of its targets, as ``routes add`` requires."""
    from tidings.targets.routed import incomplete_events_from_config

    settings = load_or_exit(config)
    if target is not None:
        require_target(settings, target)
    return incomplete_events_from_config(settings)


def _filter(
    statuses: list[str] | None,
    ids: list[str] | None,
    event_type: str | None,
    target: str | None,
    key: str | None,
    older_than: str | None,
    limit: int | None,
) -> EventFilter:
    from datetime import timedelta

    from tidings.events.outbox import EventStatus
    from tidings.outbox.incomplete import INCOMPLETE_STATUSES, EventFilter

    chosen: set[EventStatus] = set()
    for name in statuses or []:
        try:
            chosen.add(EventStatus(name.upper()))
        except ValueError:
            raise typer.BadParameter(
                f"{name!r} is not a status (use {', '.join(sorted(INCOMPLETE_STATUSES))})",
                param_hint="--status",
            ) from None
    age = seconds_option(older_than, "--older-than")
    try:
        return EventFilter(
            statuses=frozenset(chosen) or None,
            event_ids=tuple(event_ids(ids or [])),
            event_type=event_type,
            target=target,
            partition_key=key,
            older_than=timedelta(seconds=age) if age is not None else None,
            limit=limit,
        )
    except TidingsError as exc:
        raise typer.BadParameter(str(exc)) from None


@events_app.command("list")
@_filtered
def events_list(
    config: ConfigOption = None,
    *,
    where: EventFilter,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """The incomplete events in log order, with each target's state, error and failures."""
    found = _incomplete(config, where.target).find(where)
    if as_json:
        for event in found:
            record = {
                "seq": event.seq,
                "event_id": event.event_id,
                "event_type": event.event_type,
                "partition_key": event.partition_key,
                "status": event.status.value,
                "retry_count": event.retry_count,
                "logged_at": event.logged_at.isoformat(),
                "reason": event.reason,
                "targets": {n: vars(s) for n, s in event.targets.items()},
            }
            typer.echo(json.dumps(record, ensure_ascii=False))
        return
    for event in found:
        key = "" if event.partition_key is None else f" key={event.partition_key}"
        console.print(
            f"seq {event.seq} {event.status.value} {event.event_type}{key} "
            f"retries={event.retry_count} logged={event.logged_at:%Y-%m-%d %H:%M:%S} "
            f"id={event.event_id}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        if event.reason:
            console.print(f"  {event.reason}", markup=False, highlight=False, soft_wrap=True)
        for name, state in event.targets.items():
            failures = f" x{state.failures}" if state.failures else ""
            error = f": {state.error}" if state.error else ""
            line = f"  {name}: {state.state}{failures}{error}"
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(f"{len(found)} incomplete event(s) shown", highlight=False)


@events_app.command("resubmit")
@_filtered
def events_resubmit(
    config: ConfigOption = None,
    *,
    where: EventFilter,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many.")] = None,
) -> None:
    """Hand events back to the relay (default: FAILED ones); confirmed targets are not
    sent them again. --status UNROUTABLE re-drives events whose route was added since."""
    count = _incomplete(config, where.target).resubmit(where)
    console.print(f"resubmitted {count} event(s); the relay sends them in key order")


@events_app.command("park")
def events_park(
    given: Annotated[
        list[str], typer.Argument(metavar="EVENT_IDS", help="Ids of open events to set aside.")
    ],
    reason: Annotated[str, typer.Option("--reason", help="Why (kept with the event).")],
    config: ConfigOption = None,
) -> None:
    """Set open events aside: their keys flow on without them; unpark resubmits them."""
    ids = event_ids(given)
    try:
        parked = _incomplete(config).park(ids, reason)
    except TidingsError as exc:
        raise typer.BadParameter(str(exc)) from None
    for event_id in parked:
        console.print(f"parked {event_id}", markup=False)
    missed = [i for i in dict.fromkeys(ids) if i not in parked]
    for event_id in missed:
        err.print(f"not parked: {event_id} is not a PENDING, HELD or FAILED event", markup=False)
    if missed:
        raise typer.Exit(1)


@events_app.command("unpark")
def events_unpark(
    given: Annotated[list[str], typer.Argument(metavar="EVENT_IDS", help="Ids of parked events.")],
    config: ConfigOption = None,
) -> None:
    """Resubmit parked events to the relay."""
    ids = event_ids(given)
    count = _incomplete(config).unpark(ids)
    console.print(f"unparked and resubmitted {count} event(s)")
    if count < len(set(ids)):
        err.print(f"{len(set(ids)) - count} of the ids were not parked events")
        raise typer.Exit(1)


@events_app.command("blocked")
def events_blocked(
    config: ConfigOption = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many.")] = 100,
) -> None:
    """FAILED events that hold later events of their key, with how many wait behind each."""
    blocking = _incomplete(config).blocking(limit)
    if not blocking:
        console.print("no key is held behind a FAILED event")
        return
    for b in blocking:
        console.print(
            f"key {b.partition_key}: {b.held} event(s) held behind FAILED seq {b.seq} "
            f"{b.event_type} id={b.event_id}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
