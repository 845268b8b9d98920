"""The public API: what ``tidings``, ``tidings.client`` and ``tidings.events`` promise exists.

A user imports from these three places only (the README's quick starts do), so every name
they list in ``__all__`` must resolve. ``tidings`` exports the outbox, engines and the
configuration lazily, because importing any submodule (``tidings.client`` included) runs
``tidings/__init__.py`` first; a fresh interpreter shows that ``import tidings`` stays free
of the database and Spark stacks until such a name is used.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import tidings
import tidings.errors
from tests.support.helpers import HEAVY, fresh_interpreter, heavy_modules_after, parse_python

PUBLIC = ("tidings", "tidings.client", "tidings.events")


@pytest.mark.parametrize(
    ("module", "name"),
    [(module, name) for module in PUBLIC for name in importlib.import_module(module).__all__],
)
def test_every_exported_name_resolves(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) is not None


@pytest.mark.parametrize("module", PUBLIC)
def test_exports_are_listed_once_and_shown_by_dir(module: str) -> None:
    exported = importlib.import_module(module).__all__
    assert len(exported) == len(set(exported))
    assert set(exported) <= set(dir(importlib.import_module(module)))


def test_every_error_of_tidings_errors_is_exported_by_tidings() -> None:
    """One error hierarchy, all of it public: each :class:`TidingsError` (the base included)
    defined in ``tidings.errors`` is in ``tidings.__all__``."""
    defined = {
        name
        for name, value in vars(tidings.errors).items()
        if isinstance(value, type)
        and issubclass(value, tidings.errors.TidingsError)
        and value.__module__ == "tidings.errors"
    }
    assert defined - set(tidings.__all__) == set()


def test_a_name_tidings_does_not_export_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = tidings.no_such_name  # type: ignore[attr-defined]


def test_submodules_still_import_from_the_package() -> None:
    """``from tidings import client`` finds the module, not a lazily exported name."""
    from tidings import client

    assert client is importlib.import_module("tidings.client")


def test_the_lazy_names_are_the_ones_type_checkers_see() -> None:
    """The ``TYPE_CHECKING`` imports of ``tidings/__init__.py`` and its lazy map agree."""
    tree = parse_python(inspect.getsource(tidings))
    [block] = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    seen = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == tidings._LAZY


def test_import_tidings_loads_neither_sqlalchemy_nor_pyspark() -> None:
    assert heavy_modules_after("import tidings") == {top: [] for top in HEAVY}


def test_a_heavy_name_loads_sqlalchemy_when_used_and_never_spark() -> None:
    """Every name of ``tidings.__all__`` serves a producer or a server: none needs Spark."""
    loaded = heavy_modules_after(
        "import tidings\nfor name in tidings.__all__: getattr(tidings, name)"
    )
    assert loaded["sqlalchemy"], "tidings.Outbox and the others should have loaded SQLAlchemy"
    assert loaded["pyspark"] == []


def test_load_config_file_validates_targets_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """``tidings.load_config_file`` knows every target kind without another import first."""
    path = tmp_path / "tidings.yaml"
    path.write_text(
        "targets:\n"
        "  orders: {kind: event_store, url: 'sqlite:///events.db'}\n"
        "  orders-js: {kind: jetstream, stream: ORDERS, subject_prefix: orders}\n"
    )
    kinds = fresh_interpreter(
        "import tidings\n"
        f"config = tidings.load_config_file({str(path)!r})\n"
        "print(sorted(t.kind for t in config.targets.values()))"
    )
    assert kinds == "['event_store', 'jetstream']"
