"""The one client protocol (:mod:`tidings.intermediary.client.subscriber`): both clients are
a :class:`Subscriber` and send the same subscribe request; a received frame gives world
positions whether its coordinates are relative or not. (The clients against real servers
are tested in ``tests/intermediary/serving`` and ``tests/intermediary/cluster``.)"""

from __future__ import annotations

import numpy as np

from tidings.intermediary.client.client import IntermediaryClient
from tidings.intermediary.client.handover import ClusterClient
from tidings.intermediary.client.subscriber import ReceivedFrame, Subscriber, subscribe_request
from tidings.intermediary.node.generation import FrameHeader, FrameKind


def test_both_clients_are_subscribers() -> None:
    """Declared, not only alike: mypy checks each against the protocol."""
    assert Subscriber in IntermediaryClient.__mro__
    assert Subscriber in ClusterClient.__mro__


def test_a_subscribe_request_carries_capabilities_only_when_given() -> None:
    region = {"box": {"lo": [0, 0], "hi": [1, 1]}}
    plain = subscribe_request("k", region, priority=2.0, rate_hz=5.0, capabilities=None)
    assert plain == {"op": "subscribe", "key": "k", "region": region, "priority": 2.0,
                     "rate_hz": 5.0}  # fmt: skip
    capable = subscribe_request("k", region, priority=0, rate_hz=1, capabilities={"float32": 1})
    assert capable["capabilities"] == {"float32": 1}


def test_world_positions_shift_relative_frames_by_their_origin() -> None:
    positions = np.array([[1.0, 2.0]], dtype=np.float32)
    absolute = FrameHeader(FrameKind.VIEW, epoch=1, count=1, dim=2, flags=0)
    relative = FrameHeader(FrameKind.VIEW, epoch=1, count=1, dim=2, flags=0, origin=(10.0, 20.0))
    ids = np.array([7])
    assert ReceivedFrame("k", absolute, ids, positions).world_positions().tolist() == [[1, 2]]
    assert ReceivedFrame("k", relative, ids, positions).world_positions().tolist() == [[11, 22]]
    assert ReceivedFrame("k", absolute, ids, positions).world_positions().dtype == np.float64
