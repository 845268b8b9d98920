"""Marks every test in this folder ``demo``: ``pytest -m demo`` runs them."""

from tests.support.parts import part_marker

pytest_collection_modifyitems = part_marker(__file__)
