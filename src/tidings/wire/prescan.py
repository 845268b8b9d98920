"""A check of SBS bytes against their schema before the decoder sees them.

hat-sbs's C decoder trusts the counts it reads: an ``Array`` declaring 2^31 items makes it
allocate a list of 2^31 slots (seconds of the event loop and gigabytes of memory) before it
finds that the bytes are missing, and a frame of millions of one-byte items decodes into
millions of Python objects, about 60 bytes each. The pre-scan walks the bytes by the schema
without building anything and refuses, as :class:`~tidings.errors.ProtocolError`:

- a declared count whose items cannot fit in the bytes that remain (every type has a
  smallest encoding, so ``count * smallest > remaining`` is a lie) — found at the count
  itself, in microseconds, whatever the count;
- a message that would decode into more values than its budget (the caller's; see
  :func:`value_budget`) — found at an array's count when its items' smallest number of
  values already exceeds what is left, else as soon as the walk passes the budget;
- lengths that run past the end, integers longer than 64 bits (the decoder wraps them
  silently), choice indexes the schema does not have, and bytes left over at the end.

A message that passes decodes into at most its budget of values. For a top-level array the
scan can also cut the items into runs of about ``slice_bytes``, which the codec decodes one
run at a time, so a thread decoding a large message lets go of the GIL between runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hat.sbs import common

from tidings.errors import ProtocolError

#: A message may decode into one value per this many of its bytes ...
BYTES_PER_VALUE = 2
#: ... or this many values, whichever is more (small messages of tiny values stay legal).
MIN_VALUE_BUDGET = 65_536
#: The longest SBS integer of 64 bits (7 bits per byte).
_MAX_INTEGER_BYTES = 10


def value_budget(size: int) -> int:
    """How many values a message of ``size`` bytes may decode into."""
    return max(MIN_VALUE_BUDGET, size // BYTES_PER_VALUE)


@dataclass(frozen=True, slots=True)
class Slice:
    """A run of a top-level array's items: ``data[start:end]`` holds ``count`` items."""

    start: int
    end: int
    count: int


class _Budget:
    """Values the message may still decode into."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


#: What is scanned: bytes, or a memoryview of unsigned bytes (indexing gives ints).
_Bytes = bytes | memoryview
#: Scans one value at ``pos`` (of ``data``, which ends at ``end``) and returns where it ends.
_Scanner = Callable[[_Bytes, int, int, _Budget], int]


@dataclass(slots=True)
class _Compiled:
    """A type's scanner, its smallest encoding and its smallest number of values."""

    scan: _Scanner
    min_bytes: int
    min_values: int
    #: The item type when the type is an array (for the top-level slicing).
    item: _Compiled | None = None


class Schemas:
    """The scanners of every type of an evaluated SBS repository, compiled on first use."""

    def __init__(self, types: dict[common.Ref, common.Type]) -> None:
        self._types = types
        self._compiled: dict[common.Ref, _Compiled] = {}

    def check(
        self,
        module: str | None,
        type_name: str,
        data: bytes | bytearray | memoryview,
        budget: int | None = None,
        slice_bytes: int | None = None,
    ) -> list[Slice] | None:
        """Refuse ``data`` unless it is exactly one ``module.type_name`` within ``budget``
        values (default: :func:`value_budget` of its size).

        With ``slice_bytes``, a top-level array's items are returned as runs of about that
        many bytes (None for other types); see :class:`Slice`.
        """
        compiled = self._compiled.get((module, type_name)) or self._ref(
            common.Ref(module, type_name)
        )
        view = data if type(data) is bytes else memoryview(data).cast("B")
        end = len(view)
        left = _Budget(value_budget(end) if budget is None else budget)
        try:
            if slice_bytes is not None and compiled.item is not None:
                slices = _array_slices(compiled.item, view, end, left, slice_bytes)
                pos = slices[-1].end
            else:
                slices = None
                pos = compiled.scan(view, 0, end, left)
        except ProtocolError as exc:
            raise ProtocolError(f"{module}.{type_name}: undecodable SBS ({exc})") from None
        if pos != end:
            raise ProtocolError(
                f"{module}.{type_name}: undecodable SBS ({end - pos} bytes after the message)"
            )
        return slices

    def _ref(self, ref: common.Ref) -> _Compiled:
        compiled = self._compiled.get(ref)
        if compiled is None:
            compiled = self._compiled[ref] = self._compile(self._types[ref])
        return compiled

    def _compile(self, t: common.Type) -> _Compiled:
        if isinstance(t, common.Ref):
            return self._ref(t)
        if isinstance(t, common.NoneType):
            return _Compiled(_scan_none, 0, 0)
        if isinstance(t, common.BooleanType):
            return _Compiled(_scan_boolean, 1, 1)
        if isinstance(t, common.IntegerType):
            return _Compiled(_scan_integer, 1, 1)
        if isinstance(t, common.FloatType):
            return _Compiled(_scan_float, 8, 1)
        if isinstance(t, common.StringType | common.BytesType):
            return _Compiled(_scan_sized, 1, 1)
        if isinstance(t, common.ArrayType):
            item = self._compile(t.t)
            return _Compiled(_array_scanner(item), 1, 1, item)
        if isinstance(t, common.RecordType):
            fields = [self._compile(entry) for _, entry in t.entries]
            return _Compiled(
                _record_scanner([f.scan for f in fields]),
                sum(f.min_bytes for f in fields),
                1 + sum(f.min_values for f in fields),
            )
        if isinstance(t, common.ChoiceType):
            options = [self._compile(entry) for _, entry in t.entries]
            return _Compiled(
                _choice_scanner([o.scan for o in options]),
                1 + min(o.min_bytes for o in options),
                1 + min(o.min_values for o in options),
            )
        raise TypeError(f"unknown SBS type {t!r}")


# --- integers -------------------------------------------------------------------------------


def read_integer(data: _Bytes, pos: int, end: int) -> tuple[int, int]:
    """The SBS integer at ``pos`` and where it ends (7 bits a byte, the last byte marked by
    its top bit, two's complement)."""
    stop = min(end, pos + _MAX_INTEGER_BYTES)
    first = pos
    value = -1 if pos < end and data[pos] & 0x40 else 0
    while pos < stop:
        byte = data[pos]
        pos += 1
        value = (value << 7) | (byte & 0x7F)
        if byte & 0x80:
            return value, pos
    if stop < end:
        raise ProtocolError(f"integer at byte {first} is longer than 64 bits")
    raise ProtocolError(f"integer at byte {first} runs past the end")


def _count(data: _Bytes, pos: int, end: int) -> tuple[int, int]:
    count, after = read_integer(data, pos, end)
    if count < 0:
        raise ProtocolError(f"negative length {count} at byte {pos}")
    return count, after


# --- scanners -------------------------------------------------------------------------------


def _scan_none(data: _Bytes, pos: int, end: int, budget: _Budget) -> int:
    return pos


def _scan_boolean(data: _Bytes, pos: int, end: int, budget: _Budget) -> int:
    if pos >= end:
        raise ProtocolError("boolean runs past the end")
    budget.left -= 1
    return pos + 1


def _scan_integer(data: _Bytes, pos: int, end: int, budget: _Budget) -> int:
    # read_integer without the value: find the byte with the top bit (usually the first).
    if pos < end and data[pos] & 0x80:
        budget.left -= 1
        return pos + 1
    return _scan_long_integer(data, pos, end, budget)


def _scan_long_integer(data: _Bytes, pos: int, end: int, budget: _Budget) -> int:
    budget.left -= 1
    return read_integer(data, pos, end)[1]


def _scan_float(data: _Bytes, pos: int, end: int, budget: _Budget) -> int:
    if pos + 8 > end:
        raise ProtocolError("float runs past the end")
    budget.left -= 1
    return pos + 8


def _scan_sized(data: _Bytes, pos: int, end: int, budget: _Budget) -> int:
    """String or Bytes: a length, then that many bytes."""
    if pos < end and data[pos] & 0x80 and not data[pos] & 0x40:  # a one-byte length
        size, after = data[pos] & 0x3F, pos + 1
    else:
        size, after = _count(data, pos, end)
    if size > end - after:
        raise ProtocolError(f"length {size} at byte {pos} exceeds the {end - after} bytes left")
    pos = after
    budget.left -= 1
    return pos + size


def _reserve(item: _Compiled, count: int, pos: int, after: int, end: int, budget: _Budget) -> None:
    """Refuse an array (its count at ``pos``, its items from ``after``) whose declared
    ``count`` cannot be true or is over budget."""
    if count * item.min_bytes > end - after:
        raise ProtocolError(
            f"array of {count} items at byte {pos} needs at least {count * item.min_bytes} "
            f"bytes, {end - after} left"
        )
    if count * item.min_values > budget.left:
        raise ProtocolError(
            f"array of {count} items at byte {pos} exceeds the message's budget of values"
        )


def _array_scanner(item: _Compiled) -> _Scanner:
    scan_item = item.scan

    def scan(data: _Bytes, pos: int, end: int, budget: _Budget) -> int:
        count, after = _count(data, pos, end)
        _reserve(item, count, pos, after, end, budget)
        pos = after
        budget.left -= 1
        for _ in range(count):
            pos = scan_item(data, pos, end, budget)
        if budget.left < 0:
            raise ProtocolError("the message exceeds its budget of values")
        return pos

    return scan


def _array_slices(
    item: _Compiled, data: _Bytes, end: int, budget: _Budget, slice_bytes: int
) -> list[Slice]:
    """Scan a top-level array, cutting its items into runs of about ``slice_bytes``."""
    count, pos = _count(data, 0, end)
    _reserve(item, count, 0, pos, end, budget)
    scan_item = item.scan
    slices: list[Slice] = []
    start, in_slice = pos, 0
    for _ in range(count):
        pos = scan_item(data, pos, end, budget)
        in_slice += 1
        if pos - start >= slice_bytes:
            if budget.left < 0:
                raise ProtocolError("the message exceeds its budget of values")
            slices.append(Slice(start, pos, in_slice))
            start, in_slice = pos, 0
    if budget.left < 0:
        raise ProtocolError("the message exceeds its budget of values")
    if in_slice or not slices:
        slices.append(Slice(start, pos, in_slice))
    return slices


def _record_scanner(fields: list[_Scanner]) -> _Scanner:
    def scan(data: _Bytes, pos: int, end: int, budget: _Budget) -> int:
        budget.left -= 1
        for field in fields:
            pos = field(data, pos, end, budget)
        return pos

    return scan


def _choice_scanner(options: list[_Scanner]) -> _Scanner:
    def scan(data: _Bytes, pos: int, end: int, budget: _Budget) -> int:
        if pos < end and 0x80 <= data[pos] < 0x80 + len(options):  # a one-byte index
            index, after = data[pos] - 0x80, pos + 1
        else:
            index, after = read_integer(data, pos, end)
            if not 0 <= index < len(options):
                raise ProtocolError(f"choice index {index} at byte {pos} is not in the schema")
        budget.left -= 1
        return options[index](data, after, end, budget)

    return scan
