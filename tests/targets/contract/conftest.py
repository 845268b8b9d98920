"""The contract suite's fixtures: ``kind``, one :class:`KindHarness` per kind in
:data:`KINDS` (each test runs once per kind, with that kind's server markers), and the
webhook kind's endpoint.

A new target kind joins the suite by one harness module in this folder and its class here.
(The webhook kind's endpoint, ``hook_server``, is in ``tests/targets/conftest.py``.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.targets.contract.harness import KindHarness
from tests.targets.contract.jetstream import JetStreamHarness
from tests.targets.contract.mqtt import MqttHarness
from tests.targets.contract.rabbitmq import RabbitMQHarness
from tests.targets.contract.rabbitmq_stream import RabbitMQStreamHarness
from tests.targets.contract.redis_stream import RedisStreamHarness
from tests.targets.contract.webhook import WebhookHarness

KINDS: list[type[KindHarness]] = [
    JetStreamHarness,
    RabbitMQHarness,
    RabbitMQStreamHarness,
    RedisStreamHarness,
    MqttHarness,
    WebhookHarness,
]


def kind_params(
    which: Callable[[type[KindHarness]], bool] = lambda harness: True,
) -> list[pytest.ParameterSet]:
    """One parameter per kind (``which`` of them), with the markers of the server it needs;
    a check only some kinds can run takes ``kind`` through
    ``parametrize("kind", kind_params(which), indirect=True)``."""
    return [
        pytest.param(harness, marks=harness.marks, id=harness.kind)
        for harness in KINDS
        if which(harness)
    ]


@pytest.fixture(params=kind_params())
def kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KindHarness]:
    harness: KindHarness = request.param(request, tmp_path)
    yield harness
    harness.close()
