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
  :func:`value_budget`, and ``tidings.wire.codec.value_budget`` for which messages have
  one) — found at an array's count when its items' smallest number of values already
  exceeds what is left, else as soon as the walk passes the budget;
- lengths that run past the end, integers longer than 64 bits (the decoder wraps them
  silently), choice indexes the schema does not have, and bytes left over at the end.

A message that passes decodes into at most its budget of values. For a top-level array the
scan can also cut the items into runs of about ``slice_bytes``, which the codec decodes one
run at a time, so a thread decoding a large message lets go of the GIL between runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from hat.sbs import common

from tidings.errors import ProtocolError

#: A message may decode into one value per this many of its bytes ...
BYTES_PER_VALUE = 2
#: ... or this many values, whichever is more: about 60 MiB of Python objects, so messages
#: of tiny values up to a few MiB stay legal (a hat client's 14,000 payload-less events of
#: one-letter types are 70,000 values in 70 KB).
MIN_VALUE_BUDGET = 1 << 20
#: No budget: the bytes alone bound the values (every array item of hat's schemas takes at
#: least one byte, so a count is still checked against the bytes that remain).
UNBOUNDED = sys.maxsize
#: The longest SBS integer of 64 bits (7 bits per byte), and the values it may hold (the
#: decoder wraps others silently).
_MAX_INTEGER_BYTES = 10
_MIN_INTEGER, _MAX_INTEGER = -(2**63), 2**63 - 1


def value_budget(size: int) -> int:
    """How many values a message of ``size`` bytes may decode into."""
    return max(MIN_VALUE_BUDGET, size // BYTES_PER_VALUE)


@dataclass(frozen=True, slots=True)
class Slice:
    """A run of a top-level array's items: ``data[start:end]`` holds ``count`` items."""

    start: int
    end: int
    count: int


#: What is scanned: bytes, a bytearray or a memoryview of unsigned bytes (indexing gives ints).
_Bytes = bytes | bytearray | memoryview
#: Scans one value at ``pos`` (of ``data``, which ends at ``end``) with ``left`` values of the
#: budget left, and returns where it ends and what is left.
_Scanner = Callable[[_Bytes, int, int, int], tuple[int, int]]


@dataclass(frozen=True, slots=True)
class _Shape:
    """A type's smallest encoding and its smallest number of values."""

    min_bytes: int
    min_values: int


class Schemas:
    """The scanners of every type of an evaluated SBS repository, compiled on first use.

    A scanner is Python source generated from the type, every record, choice and array of it
    written out in one function, and compiled: the walk runs for every message a client
    sends, and a function call per field (the interpreter's natural shape for it) cost more
    than the checks themselves (2.4 against 1.2 µs an event of a register request).
    """

    def __init__(self, types: dict[common.Ref, common.Type]) -> None:
        self._types = types
        self._shapes: dict[common.Ref, _Shape] = {}
        self._scanners: dict[common.Ref, _Scanner] = {}
        #: A top-level array type's item scanner (for the slicing), by the array's ref.
        self._items: dict[common.Ref, tuple[_Shape, _Scanner] | None] = {}

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
        ref = common.Ref(module, type_name)
        view = data if type(data) is bytes else memoryview(data).cast("B")
        end = len(view)
        left = value_budget(end) if budget is None else budget
        try:
            item = self._item(ref) if slice_bytes is not None else None
            if item is not None and slice_bytes is not None:
                slices = _array_slices(*item, view, end, left, slice_bytes)
                pos = slices[-1].end
            else:
                slices = None
                pos, left = self._scanner(ref)(view, 0, end, left)
                if left < 0:  # the values after the last array (scanners check at arrays)
                    raise ProtocolError("the message exceeds its budget of values")
        except ProtocolError as exc:
            raise ProtocolError(f"{module}.{type_name}: undecodable SBS ({exc})") from None
        except IndexError:  # a scanner read the byte after the last (see _Source)
            raise ProtocolError(
                f"{module}.{type_name}: undecodable SBS (a value runs past the end)"
            ) from None
        if pos != end:
            raise ProtocolError(
                f"{module}.{type_name}: undecodable SBS ({end - pos} bytes after the message)"
            )
        return slices

    def _scanner(self, ref: common.Ref) -> _Scanner:
        scanner = self._scanners.get(ref)
        if scanner is None:
            scanner = self._scanners[ref] = self._generate(ref, self._types[ref])
        return scanner

    def _item(self, ref: common.Ref) -> tuple[_Shape, _Scanner] | None:
        if ref not in self._items:
            t = self._resolve(self._types[ref])
            self._items[ref] = (
                (self._shape(t.t), self._generate(ref, t.t))
                if isinstance(t, common.ArrayType)
                else None
            )
        return self._items[ref]

    def _resolve(self, t: common.Type) -> common.Type:
        while isinstance(t, common.Ref):
            t = self._types[t]
        return t

    def _shape(self, t: common.Type, seen: tuple[common.Ref, ...] = ()) -> _Shape:
        if isinstance(t, common.Ref):
            if t in seen:
                raise TypeError(f"recursive SBS type {t.module}.{t.name} cannot be pre-scanned")
            shape = self._shapes.get(t)
            if shape is None:
                shape = self._shapes[t] = self._shape(self._types[t], (*seen, t))
            return shape
        if isinstance(t, common.NoneType):
            return _Shape(0, 0)
        if isinstance(t, common.FloatType):
            return _Shape(8, 1)
        if isinstance(
            t,
            common.BooleanType
            | common.IntegerType
            | common.StringType
            | common.BytesType
            | common.ArrayType,
        ):
            return _Shape(1, 1)
        if isinstance(t, common.RecordType):
            fields = [self._shape(entry, seen) for _, entry in t.entries]
            return _Shape(sum(f.min_bytes for f in fields), 1 + sum(f.min_values for f in fields))
        if isinstance(t, common.ChoiceType):
            options = [self._shape(entry, seen) for _, entry in t.entries]
            return _Shape(
                1 + min(o.min_bytes for o in options), 1 + min(o.min_values for o in options)
            )
        raise TypeError(f"unknown SBS type {t!r}")

    def _generate(self, ref: common.Ref, t: common.Type) -> _Scanner:
        """Compile the scanner of ``t`` (named after ``ref``, for tracebacks)."""
        source = _Source(self._types, self._shape)
        source.scan(t, 1, ())
        source.flush(1)
        text = (
            "def scan(data, pos, end, left):\n"
            + "\n".join(source.lines)
            + "\n    return pos, left\n"
        )
        namespace: dict[str, object] = {
            "ProtocolError": ProtocolError,
            "count_at": _count,
            "integer_end": _integer_end,
            "choice_index": _choice_index,
            "refuse_array": _refuse_array,
        }
        exec(compile(text, f"<SBS scanner of {ref.module}.{ref.name}>", "exec"), namespace)
        return cast(_Scanner, namespace["scan"])  # the function the text above defines


class _Source:
    """The lines of one generated scanner: each type's checks written where it occurs.

    The code keeps ``pos`` (where the next value starts) and ``left`` (the budget) in
    locals; ``size``, ``count``, ``after`` and ``index`` are scratch, each used before
    anything nested can overwrite it. It reads ``data[pos]`` without comparing ``pos`` with
    ``end`` first: ``end`` is the length of ``data``, so a value cut short raises IndexError,
    which :meth:`Schemas.check` refuses. The values a run of code without branches counts
    are taken from ``left`` at once, before anything reads it or branches.
    """

    def __init__(
        self,
        types: dict[common.Ref, common.Type],
        shape: Callable[[common.Type, tuple[common.Ref, ...]], _Shape],
    ) -> None:
        self._types = types
        self._shape = shape
        self.lines: list[str] = []
        self._uncounted = 0

    def _add(self, depth: int, *lines: str) -> None:
        self.lines.extend("    " * depth + line for line in lines)

    def _count(self, values: int = 1) -> None:
        self._uncounted += values

    def flush(self, depth: int) -> None:
        """Take the values counted so far from ``left``."""
        if self._uncounted:
            self._add(depth, f"left -= {self._uncounted}")
            self._uncounted = 0

    def scan(self, t: common.Type, depth: int, seen: tuple[common.Ref, ...]) -> None:
        if isinstance(t, common.Ref):
            if t in seen:
                raise TypeError(f"recursive SBS type {t.module}.{t.name} cannot be pre-scanned")
            self.scan(self._types[t], depth, (*seen, t))
        elif isinstance(t, common.NoneType):
            pass
        elif isinstance(t, common.BooleanType):
            self._add(
                depth, "if pos >= end:", "    raise ProtocolError('boolean runs past the end')"
            )
            self._add(depth, "pos += 1")
            self._count()
        elif isinstance(t, common.IntegerType):
            # Usually one byte: the first has the top bit that marks an integer's last.
            self._add(
                depth,
                "if data[pos] & 0x80:",
                "    pos += 1",
                "else:",
                "    pos = integer_end(data, pos, end)",
            )
            self._count()
        elif isinstance(t, common.FloatType):
            self._add(
                depth,
                "if pos + 8 > end:",
                "    raise ProtocolError('float runs past the end')",
                "pos += 8",
            )
            self._count()
        elif isinstance(t, common.StringType | common.BytesType):
            self._add(depth, *_count_lines("size"))
            self._add(
                depth,
                "if size > end - after:",
                "    raise ProtocolError(",
                "        f'length {size} at byte {pos} exceeds the {end - after} bytes left'",
                "    )",
                "pos = after + size",
            )
            self._count()
        elif isinstance(t, common.ArrayType):
            item = self._shape(t.t, seen)
            self.flush(depth)
            self._add(depth, *_count_lines("count"))
            self._add(
                depth,
                f"if count * {item.min_bytes} > end - after or count * {item.min_values} > left:",
                f"    refuse_array(count, {item.min_bytes}, pos, after, end)",
                "pos = after",
                "left -= 1",
                "for _ in range(count):",
            )
            before = len(self.lines)
            self.scan(t.t, depth + 1, seen)
            self.flush(depth + 1)
            if len(self.lines) == before:  # items of no bytes (None)
                self._add(depth + 1, "pass")
            self._add(
                depth,
                "if left < 0:",
                "    raise ProtocolError('the message exceeds its budget of values')",
            )
        elif isinstance(t, common.RecordType):
            self._count()
            for _, entry in t.entries:
                self.scan(entry, depth, seen)
        elif isinstance(t, common.ChoiceType):
            options = len(t.entries)
            self._count()
            self.flush(depth)
            self._add(
                depth,
                f"if 0x80 <= data[pos] < {0x80 + options}:  # a one-byte index",
                "    index = data[pos] - 0x80",
                "    pos += 1",
                "else:",
                f"    index, pos = choice_index(data, pos, end, {options})",
            )
            for number, (_, entry) in enumerate(t.entries):
                self._add(depth, f"{'if' if number == 0 else 'elif'} index == {number}:")
                before = len(self.lines)
                self.scan(entry, depth + 1, seen)
                self.flush(depth + 1)
                if len(self.lines) == before:
                    self._add(depth + 1, "pass")
        else:
            raise TypeError(f"unknown SBS type {t!r}")


def _count_lines(name: str) -> tuple[str, ...]:
    """Read a length or count into ``name`` and where its bytes start into ``after``: one
    byte for 0-63, the common case, inline."""
    return (
        "if data[pos] & 0xC0 == 0x80:",
        f"    {name}, after = data[pos] & 0x3F, pos + 1",
        "else:",
        f"    {name}, after = count_at(data, pos, end)",
    )


# --- integers -------------------------------------------------------------------------------


def read_integer(data: _Bytes, pos: int, end: int) -> tuple[int, int]:
    """The SBS integer at ``pos`` and where it ends (7 bits a byte, the last byte marked by
    its top bit, two's complement)."""
    if pos < end and data[pos] & 0x80:  # one byte (flags, choices, short lengths): 7 bits
        byte = data[pos]
        return (byte & 0x7F) - ((byte & 0x40) << 1), pos + 1
    stop = min(end, pos + _MAX_INTEGER_BYTES)
    first = pos
    value = -1 if pos < end and data[pos] & 0x40 else 0
    while pos < stop:
        byte = data[pos]
        pos += 1
        value = (value << 7) | (byte & 0x7F)
        if byte & 0x80:
            if not _MIN_INTEGER <= value <= _MAX_INTEGER:  # 10 bytes hold 70 bits
                raise ProtocolError(f"integer at byte {first} is longer than 64 bits")
            return value, pos
    if stop < end:
        raise ProtocolError(f"integer at byte {first} is longer than 64 bits")
    raise ProtocolError(f"integer at byte {first} runs past the end")


def _integer_end(data: _Bytes, pos: int, end: int) -> int:
    return read_integer(data, pos, end)[1]


def _count(data: _Bytes, pos: int, end: int) -> tuple[int, int]:
    count, after = read_integer(data, pos, end)
    if count < 0:
        raise ProtocolError(f"negative length {count} at byte {pos}")
    return count, after


def _choice_index(data: _Bytes, pos: int, end: int, options: int) -> tuple[int, int]:
    index, after = read_integer(data, pos, end)
    if not 0 <= index < options:
        raise ProtocolError(f"choice index {index} at byte {pos} is not in the schema")
    return index, after


def _refuse_array(count: int, min_bytes: int, pos: int, after: int, end: int) -> None:
    """Refuse an array (its count at ``pos``, its items from ``after``) whose declared
    ``count`` cannot be true (its items' smallest encoding is longer than what is left) or
    is over budget (else)."""
    if count * min_bytes > end - after:
        raise ProtocolError(
            f"array of {count} items at byte {pos} needs at least {count * min_bytes} "
            f"bytes, {end - after} left"
        )
    raise ProtocolError(
        f"array of {count} items at byte {pos} exceeds the message's budget of values"
    )


def _array_slices(
    item: _Shape, scan_item: _Scanner, data: _Bytes, end: int, left: int, slice_bytes: int
) -> list[Slice]:
    """Scan a top-level array, cutting its items into runs of about ``slice_bytes``."""
    count, pos = _count(data, 0, end)
    if count * item.min_bytes > end - pos or count * item.min_values > left:
        _refuse_array(count, item.min_bytes, 0, pos, end)
    left -= 1
    slices: list[Slice] = []
    start, in_slice = pos, 0
    for _ in range(count):
        pos, left = scan_item(data, pos, end, left)
        in_slice += 1
        if pos - start >= slice_bytes:
            if left < 0:
                raise ProtocolError("the message exceeds its budget of values")
            slices.append(Slice(start, pos, in_slice))
            start, in_slice = pos, 0
    if left < 0:
        raise ProtocolError("the message exceeds its budget of values")
    if in_slice or not slices:
        slices.append(Slice(start, pos, in_slice))
    return slices
