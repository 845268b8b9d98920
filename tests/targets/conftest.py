"""Marks every test in this folder ``targets``: ``pytest -m targets`` runs them. And the
webhook tests' endpoint, shared by the webhook kind's tests and the contract suite."""

from collections.abc import Iterator

import pytest

from tests.support.parts import part_marker
from tests.targets.kinds.webhook_support import HookServer

pytest_collection_modifyitems = part_marker(__file__)


@pytest.fixture(scope="session")
def hook_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HookServer]:
    """The test endpoint (:mod:`tests.targets.kinds.webhook_server`) as one process for the
    session, started the first time a test needs it."""
    hook = HookServer(tmp_path_factory.mktemp("hook"))
    hook.start()
    yield hook
    hook.kill()
