"""The marker of a part: each folder of ``tests/`` marks its own tests with its part's name,
so ``pytest -m server`` selects the event server's tests wherever they are collected from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


def part_marker(conftest_file: str) -> Callable[[list[pytest.Item]], None]:
    """A ``pytest_collection_modifyitems`` hook for the ``conftest.py`` at ``conftest_file``:
    every test collected under that folder gets the folder's name as a marker."""
    folder = Path(conftest_file).resolve().parent
    marker = getattr(pytest.mark, folder.name)

    def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
        for item in items:
            if folder in item.path.resolve().parents:
                item.add_marker(marker)

    return pytest_collection_modifyitems
