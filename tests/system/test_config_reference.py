"""The configuration reference of the documentation site lists every key a file may hold.

The site renders it from the pydantic models when it is built (``docs/hooks/config_reference.py``,
a hook of ``mkdocs.yml``); these tests render it the same way and look for every field of
every model, found here by a walk of their annotations of its own, so a section the renderer
skipped is a failure rather than a gap on the site.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, get_args

from pydantic import BaseModel, Field

import tidings.targets.registry  # noqa: F401 - enters the target kinds' models
from tidings.config import IntermediaryConfig, TargetConfig, TidingsConfig
from tidings.config.server import ServerConfig
from tidings.config.streams import AggregateConfig, StreamServerConfig

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "docs" / "hooks" / "config_reference.py"


def _hook() -> ModuleType:
    """The hook module, loaded from its file as MkDocs loads it."""
    name = "tidings_docs_config_reference"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HOOK)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _builtin_kinds() -> list[type[TargetConfig]]:
    """tidings' own target kinds: a plug-in's model that a test loaded into this process
    (tests/targets/test_plugins.py) is the plug-in's to document, not the reference's."""
    return [k for k in TargetConfig.__subclasses__() if k.__module__.startswith("tidings.")]


def _models_in(path: str, annotation: Any) -> Iterator[tuple[str, type[BaseModel]]]:
    """The models an annotation holds, with the key path of their keys."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation is TargetConfig:
            for kind in _builtin_kinds():
                yield path, kind
        else:
            yield path, annotation
        return
    origin = getattr(annotation, "__origin__", None)
    args = get_args(annotation)
    if origin is list:
        for arg in args:
            yield from _models_in(f"{path}[]", arg)
    elif origin is dict:
        yield from _models_in(f"{path}.<name>", args[-1])
    else:
        for arg in args:
            yield from _models_in(path, arg)


def _key_paths(model: type[BaseModel]) -> Iterator[str]:
    """Every key path a file of ``model`` may hold."""
    for path, sub_model in _models(model):
        for name, field in sub_model.model_fields.items():
            if not field.exclude:
                yield f"{path}.{name}" if path else name


def test_every_key_of_every_file_is_in_its_reference() -> None:
    hook = _hook()
    for name, root in (
        ("tidings", TidingsConfig),
        ("server", StreamServerConfig),
        ("aggregate", AggregateConfig),
    ):
        reference = hook.render_reference(name)
        missing = [path for path in _key_paths(root) if f"| `{path}` |" not in reference]
        assert not missing, f"{name}: keys missing from the reference: {missing}"


def test_the_references_cover_the_event_server_the_streams_and_the_intermediary() -> None:
    hook = _hook()
    server = hook.render_reference("server")
    for name in ServerConfig.model_fields:
        if name != "base_dir":  # where relative paths start: not a key of the file
            assert f"| `{name}` |" in server
    for path in ("streams[].retention.min_age", "stream_users.<name>.password_hash_env"):
        assert f"| `{path}` |" in server
    assert "base_dir" not in server
    tidings_yaml = hook.render_reference("tidings")
    for name in IntermediaryConfig.model_fields:
        assert f"| `intermediary.{name}` |" in tidings_yaml
    for path in ("intermediary.spatial.margin", "intermediary.tables.<name>.keyed_by"):
        assert f"| `{path}` |" in tidings_yaml
    kinds = [get_args(k.model_fields["kind"].annotation)[0] for k in _builtin_kinds()]
    assert len(kinds) >= 3
    for kind in kinds:
        assert f"(kind {kind})" in tidings_yaml
    assert "| `targets.<name>.subject_template` |" in tidings_yaml


def _models(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    """``model`` and every model under it, with the key path each sits at."""
    yield prefix, model
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        path = f"{prefix}.{name}" if prefix else name
        for sub_path, sub_model in _models_in(path, field.annotation):
            yield from _models(sub_model, sub_path)


def test_every_key_of_every_file_has_a_description() -> None:
    undescribed = [
        f"{name}: {f'{path}.' if path else ''}{key} ({model.__qualname__})"
        for name, root in (
            ("tidings", TidingsConfig),
            ("server", StreamServerConfig),
            ("aggregate", AggregateConfig),
        )
        for path, model in _models(root)
        for key, field in model.model_fields.items()
        if not field.exclude and not (field.description or "").strip()
    ]
    assert not undescribed, f"keys without a Field(description=...): {undescribed}"


class _Described(BaseModel):
    """A model whose fields have descriptions, or not."""

    window: int = Field(default=3, gt=0, description="how many | to keep, at most")
    plain: str = "x"
    nested: _Inner | None = None


class _Inner(BaseModel):
    deep: list[str] = Field(default_factory=list, description="the inner keys")


_Described.model_rebuild()


def test_descriptions_defaults_and_bounds_are_rendered_and_a_missing_description_is_empty() -> None:
    text = _hook().render(_Described)
    assert "| `window` | int, > 0 | `3` | how many \\| to keep, at most |" in text
    assert "| `plain` | str | `x` |  |" in text
    assert "| `nested.deep` | list of str | `[]` | the inner keys |" in text
    assert "{ #nested }" in text


def test_a_marker_becomes_its_reference() -> None:
    page = "# Title\n\n<!-- config-reference: aggregate -->\n"
    rendered = _hook().on_page_markdown(page)
    assert "config-reference" not in rendered
    assert "| `destination.database` |" in rendered


#: How an internal issue is cited: "issue 11", "issues 7 and 8", "#12", "(issue 23, item 4)".
_ISSUE = re.compile(r"\bissues? \d+|(?<![\w&/])#\d+\b", re.IGNORECASE)


def test_no_page_cites_an_internal_issue() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    texts = {str(page.relative_to(ROOT)): page.read_text(encoding="utf-8") for page in pages}
    for name in ("tidings", "server", "aggregate"):
        texts[f"the {name} reference"] = _hook().render_reference(name)
    cited = {where: _ISSUE.findall(text) for where, text in texts.items() if _ISSUE.search(text)}
    assert not cited
