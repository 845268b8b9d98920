"""Conditions on an event's data: the filter FTN18 2.2.3 lets a generator apply "for
security reasons", and whatever else must decide on an event by what it carries.

A filter is written as a mapping from JSON Pointers (RFC 6901) into the data to conditions,
all of which must hold::

    /tenant: acme                    # equal to this JSON scalar
    /order/region: {in: [eu, uk]}    # equal to one of these
    /kind: {not_in: [test, demo]}    # present, and equal to none of these
    /flags/0: {exists: true}         # present (false: absent)
    /amount: {equals: 0}             # the long form of the first

The language is data, not code: it is compiled once, when the configuration is loaded, into
:class:`DataFilter`, and evaluating it looks values up (no ``eval``, no regular expressions
written by the user, nothing that can loop), so a filter costs a few dictionary lookups per
event whatever it says, and one that is wrong is refused at load with the pointer it is
about. Comparison is by JSON value: ``1`` equals ``1.0``, but ``true`` is not ``1`` and
``"1"`` is not ``1`` (Python's ``True == 1`` must not let an event through). A condition on a
pointer the data does not have is false, whatever its operator, except ``exists: false``: a
filter fails closed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tidings.errors import ConfigError

#: The most conditions one filter holds, values one ``in`` list holds, segments one
#: pointer has: generous bounds that keep one event's check cheap.
MAX_CONDITIONS = 64
MAX_VALUES = 10_000
MAX_DEPTH = 32
_INDEX = re.compile(r"^(0|[1-9][0-9]*)$")
_OPERATORS = ("equals", "in", "not_in", "exists")
_MISSING = object()

#: A JSON scalar as compared here: its JSON kind and its value.
_Key = tuple[str, Any]


def _key(value: Any) -> _Key | None:
    """The comparison key of a JSON value; None for an object or an array (which equal no
    scalar)."""
    if value is None:
        return ("null", None)
    if isinstance(value, bool):
        return ("boolean", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    return None


@dataclass(frozen=True, slots=True)
class Condition:
    """One pointer and what its value must be."""

    pointer: str
    path: tuple[str, ...]
    operator: str
    values: frozenset[_Key]
    shown: str

    def holds(self, data: Any) -> bool:
        value = resolve(data, self.path)
        if self.operator == "exists":
            return (value is not _MISSING) == (("boolean", True) in self.values)
        if value is _MISSING:
            return False
        found = _key(value) in self.values
        return not found if self.operator == "not_in" else found


@dataclass(frozen=True, slots=True)
class DataFilter:
    """A compiled filter: true for data every condition holds for."""

    conditions: tuple[Condition, ...]

    def __call__(self, data: Any) -> bool:
        return all(condition.holds(data) for condition in self.conditions)

    def describe(self) -> str:
        """The filter as a person reads it: ``/tenant = "acme" and /kind not in [...]``."""
        return " and ".join(condition.shown for condition in self.conditions) or "(always)"


def resolve(data: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` in ``data``, or the module's missing marker."""
    value = data
    for segment in path:
        if isinstance(value, dict):
            value = value.get(segment, _MISSING)
        elif isinstance(value, list) and _INDEX.match(segment) and int(segment) < len(value):
            value = value[int(segment)]
        else:
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """The segments of an RFC 6901 JSON Pointer (``""`` is the whole data); ConfigError if
    it is not one."""
    if not isinstance(pointer, str):
        raise ConfigError(f"{pointer!r} is not a JSON Pointer (a string like /tenant)")
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise ConfigError(
            f"{pointer!r} is not a JSON Pointer: it starts with / (e.g. /tenant, /order/region)"
        )
    segments = pointer[1:].split("/")
    if len(segments) > MAX_DEPTH:
        raise ConfigError(f"{pointer!r} is deeper than {MAX_DEPTH} segments")
    for segment in segments:
        if re.search(r"~(?![01])", segment):
            raise ConfigError(
                f"{pointer!r}: '~' in a JSON Pointer is written ~0, and '/' inside a key ~1"
            )
    return tuple(s.replace("~1", "/").replace("~0", "~") for s in segments)


def compile_filter(where: Mapping[str, Any]) -> DataFilter:
    """Compile a filter as written (see the module docstring); ConfigError naming the
    pointer and what is wrong with its condition."""
    if not isinstance(where, Mapping):
        raise ConfigError(
            "a data filter is a mapping of JSON Pointers to conditions, e.g. {/tenant: acme}"
        )
    if not where:
        raise ConfigError("a data filter needs at least one condition (leave it out for none)")
    if len(where) > MAX_CONDITIONS:
        raise ConfigError(f"a data filter holds at most {MAX_CONDITIONS} conditions")
    return DataFilter(tuple(_condition(pointer, spec) for pointer, spec in where.items()))


def _condition(pointer: str, spec: Any) -> Condition:
    path = parse_pointer(pointer)
    try:
        if isinstance(spec, Mapping):
            if len(spec) != 1 or next(iter(spec)) not in _OPERATORS:
                raise ConfigError(
                    f"give one of {', '.join(_OPERATORS)} (or a JSON scalar to compare with), "
                    f"not {', '.join(map(str, spec)) or 'an empty mapping'}"
                )
            [(operator, operand)] = spec.items()
        else:
            operator, operand = "equals", spec
        values, shown = _operand(operator, operand)
    except ConfigError as exc:
        raise ConfigError(f"{pointer}: {exc}") from None
    return Condition(pointer, path, operator, values, f"{pointer or '(data)'} {shown}")


def _operand(operator: str, operand: Any) -> tuple[frozenset[_Key], str]:
    """The comparison keys of an operator's operand, and how it reads."""
    if operator == "exists":
        if not isinstance(operand, bool):
            raise ConfigError(f"exists takes true or false, not {_shown(operand)}")
        return frozenset({("boolean", operand)}), "exists" if operand else "is absent"
    if operator == "equals":
        return frozenset({_scalar(operand)}), f"= {_shown(operand)}"
    if not isinstance(operand, list) or not operand:
        raise ConfigError(f"{operator} takes a non-empty list of JSON scalars")
    if len(operand) > MAX_VALUES:
        raise ConfigError(f"{operator} takes at most {MAX_VALUES} values")
    keys = frozenset(_scalar(item) for item in operand)
    listed = ", ".join(_shown(item) for item in operand[:5]) + (", ..." if len(operand) > 5 else "")
    return keys, f"{'in' if operator == 'in' else 'not in'} [{listed}]"


def _scalar(value: Any) -> _Key:
    key = _key(value)
    if key is None or (isinstance(value, float) and not math.isfinite(value)):
        raise ConfigError(
            f"{_shown(value)} is not a JSON scalar (a string, a number, true, false or null)"
        )
    return key


def _shown(value: Any) -> str:
    """A value as JSON (cut short), or its kind when it is not a JSON scalar."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if _key(value) is None:
        return f"a {type(value).__name__}"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."
