"""Marks every test in this folder ``client``: ``pytest -m client`` runs them."""

from tests.support.parts import part_marker

pytest_collection_modifyitems = part_marker(__file__)
