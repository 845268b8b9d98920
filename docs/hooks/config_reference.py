"""The configuration reference, rendered from the pydantic models when the site is built.

A page asks for a reference with a marker line, ``<!-- config-reference: NAME -->``, where
NAME is one of :data:`REFERENCES`; MkDocs runs :func:`on_page_markdown` (this file is a hook
of ``mkdocs.yml``) and the marker becomes a table per section of that file: every key with
its type, its default and its description. The models are the ones tidings validates files
with, imported by the names their packages export, so the reference cannot drift from what
a file may hold. A field without a ``Field(description=...)`` gets an empty description
rather than an error, and a model that allows keys of its own (an event server backend,
an engine module) says so.

``targets:`` entries are validated against the model of their ``kind``; each kind's model is
entered by the target registry when it is imported, so the reference imports the registry
and renders one section per kind it entered.
"""

from __future__ import annotations

import importlib
import re
import types
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

#: Marker name -> (module, model) of the file it documents.
REFERENCES: dict[str, tuple[str, str]] = {
    "tidings": ("tidings.config", "TidingsConfig"),
    "server": ("tidings.config.streams", "StreamServerConfig"),
    "aggregate": ("tidings.config.streams", "AggregateConfig"),
}
#: The module that enters every target kind's model when imported.
TARGET_REGISTRY = "tidings.targets.registry"
#: The base model of ``targets:`` entries, whose subclasses are the kinds.
TARGET_BASE = ("tidings.config", "TargetConfig")

_MARKER = re.compile(r"^<!-- config-reference: ([a-z_-]+) -->$", re.MULTILINE)


@dataclass(frozen=True)
class Section:
    """One model at one place of a file: ``path`` is its key path (``relay.retry``,
    ``streams[]``, ``targets.<name>``; empty at the top), ``note`` what the path holds
    when that is not plain (the kind of a target)."""

    path: str
    model: type[BaseModel]
    description: str = ""
    note: str = ""

    @property
    def anchor(self) -> str:
        """The section's HTML id: its path with every run of other characters as ``-``."""
        return re.sub(r"[^a-z0-9]+", "-", f"{self.path} {self.note}".lower()).strip("-") or "top"


def load_model(module: str, name: str) -> type[BaseModel]:
    """The model ``name`` of ``module``."""
    model = getattr(importlib.import_module(module), name)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"{module}.{name} is not a pydantic model")
    return model


def target_kinds() -> list[tuple[str, type[BaseModel]]]:
    """Every target kind and its model, as the target registry entered them."""
    importlib.import_module(TARGET_REGISTRY)
    base = load_model(*TARGET_BASE)
    kinds = []
    pending = list(base.__subclasses__())
    while pending:
        model = pending.pop()
        pending.extend(model.__subclasses__())
        kind = get_args(model.model_fields["kind"].annotation)
        if len(kind) == 1:
            kinds.append((str(kind[0]), model))
    return sorted(kinds)


def _strip(annotation: Any) -> Any:
    """``annotation`` without ``Annotated`` metadata."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _members(annotation: Any) -> tuple[Any, ...]:
    """The members of a union (``X | None``, ``Union[X, Y]``), else the annotation alone."""
    annotation = _strip(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(_strip(member) for member in get_args(annotation))
    return (annotation,)


def nested(path: str, field: FieldInfo) -> tuple[str, type[BaseModel]] | None:
    """The section a field holds, if it holds models: its path and model (``name`` for a
    model or an optional one, ``name[]`` for a list of them, ``name.<name>`` for a map)."""
    for member in _members(field.annotation):
        if _is_model(member):
            return path, member
        origin, args = get_origin(member), [_strip(a) for a in get_args(member)]
        if origin is list and args and _is_model(args[0]):
            return f"{path}[]", args[0]
        if origin is dict and len(args) == 2 and _is_model(args[1]):
            return f"{path}.<name>", args[1]
    return None


def sections(root: type[BaseModel]) -> Iterator[Section]:
    """The root model and every section under it, depth first in field order; ``targets:``
    entries once per kind."""
    target_base = load_model(*TARGET_BASE)

    def walk(section: Section) -> Iterator[Section]:
        yield section
        for name, field in section.model.model_fields.items():
            if field.exclude:
                continue
            path = f"{section.path}.{name}" if section.path else name
            found = nested(path, field)
            if found is None:
                continue
            sub_path, model = found
            description = field.description or ""
            if model is target_base:
                for kind, kind_model in target_kinds():
                    yield from walk(Section(sub_path, kind_model, description, f"kind {kind}"))
            else:
                yield from walk(Section(sub_path, model, description))

    yield from walk(Section("", root))


def type_text(annotation: Any) -> str:
    """A field's type in words: ``int``, ``duration``, ``list of str``, ``a | b``."""
    annotation = _strip(annotation)
    members = _members(annotation)
    if len(members) > 1:
        return " or ".join(type_text(member) for member in members)
    if annotation is type(None) or annotation is None:
        return "null"
    if annotation is Any:
        return "any"
    if annotation is timedelta:
        return "duration"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    if _is_model(annotation):
        return "section"
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " or ".join(f"`{value}`" for value in args)
    if origin is list:
        return f"list of {type_text(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {type_text(args[0])} to {type_text(args[1])}" if args else "map"
    return getattr(annotation, "__name__", str(annotation))


#: How each annotated-types bound reads: its class, the attribute holding the bound, the text.
_BOUNDS = (
    (annotated_types.Gt, "gt", "> {}"),
    (annotated_types.Ge, "ge", "≥ {}"),
    (annotated_types.Lt, "lt", "< {}"),
    (annotated_types.Le, "le", "≤ {}"),
    (annotated_types.MinLen, "min_length", "length ≥ {}"),
    (annotated_types.MaxLen, "max_length", "length ≤ {}"),
)


def constraints_text(field: FieldInfo) -> str:
    """The bounds validation holds a value to (``> 0``, ``≤ 10``, a pattern, lengths)."""
    parts = []
    for item in field.metadata:
        for kind, attribute, text in _BOUNDS:
            if isinstance(item, kind):
                parts.append(text.format(getattr(item, attribute)))
                break
        else:
            if (pattern := getattr(item, "pattern", None)) is not None:
                parts.append(f"matching `{pattern}`")
    return ", ".join(parts)


def duration_text(value: timedelta) -> str:
    """A duration as a file would write it: ``200ms``, ``30s``, ``5m``, ``7d``."""
    seconds = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{round(seconds * 1000, 3):g}ms"


def value_text(value: Any) -> str:
    """A default as YAML would write it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, timedelta):
        return duration_text(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(value_text(item) for item in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{" + ", ".join(f"{k}: {value_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return value or '""'
    return str(value)


def default_text(field: FieldInfo, is_section: bool) -> str:
    """What a file that leaves the key out gets (``is_section``: the field is a section
    itself, not a list or map of them, so a default is its keys' defaults)."""
    if is_section and (field.default_factory is not None or isinstance(field.default, BaseModel)):
        return "its keys' defaults"
    if field.default is not PydanticUndefined:
        return f"`{value_text(field.default)}`"
    factory = field.default_factory
    if factory is None:
        return "required"
    try:
        value = factory()  # type: ignore[call-arg]  # a factory taking no data
    except TypeError:
        return "computed"
    return f"`{value_text(value)}`"


def _cell(text: str) -> str:
    """``text`` on one line, its pipes escaped so they stay inside the table cell (a pipe
    in a code span needs no escape: the table reads code spans whole)."""
    pieces = " ".join(text.split()).split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(pieces))


def _section_link(path: str, model: type[BaseModel]) -> str:
    """A link to the section a field holds (for ``targets:``, to its first kind)."""
    if model is load_model(*TARGET_BASE):
        kind, kind_model = target_kinds()[0]
        return f"[one section per kind](#{Section(path, kind_model, note=f'kind {kind}').anchor})"
    return f"[section](#{Section(path, model).anchor})"


def render_section(section: Section, level: int) -> str:
    """A section's heading and its table of keys."""
    title = f"`{section.path}`" if section.path else "Top level"
    if section.note:
        title += f" ({section.note})"
    lines = [f"{'#' * level} {title} {{ #{section.anchor} }}", ""]
    if section.description:
        lines += [_cell(section.description), ""]
    lines += ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in section.model.model_fields.items():
        if field.exclude:
            continue
        path = f"{section.path}.{name}" if section.path else name
        found = nested(path, field)
        kind = type_text(field.annotation)
        if found is not None:
            kind = kind.replace("section", _section_link(*found))
        bounds = constraints_text(field)
        if bounds:
            kind += f", {bounds}"
        row = [
            f"`{path}`",
            _cell(kind),
            _cell(default_text(field, found is not None and found[0] == path)),
            _cell(field.description or ""),
        ]
        lines.append("| " + " | ".join(row) + " |")
    if section.model.model_config.get("extra") == "allow":
        lines += ["", "Other keys are allowed: they are passed on as the entry's own options."]
    return "\n".join(lines)


def render(root: type[BaseModel], level: int = 2) -> str:
    """The reference of a whole file: one section per model under ``root``."""
    return "\n\n".join(render_section(section, level) for section in sections(root)) + "\n"


def render_reference(name: str) -> str:
    """The reference a marker names."""
    return render(load_model(*REFERENCES[name]))


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: each marker line replaced by its reference."""
    return _MARKER.sub(lambda match: render_reference(match.group(1)), markdown)
