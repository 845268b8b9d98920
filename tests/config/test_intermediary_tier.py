"""The ``intermediary_tiers:`` section: a tier that cannot run is refused with a message naming
the field and the problem, and one that can is read with its responsibility split."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tidings.config import load_config, load_config_file
from tidings.errors import ConfigError
from tidings.intermediary.cluster.responsibility import HashPartition, RegionPartition
from tidings.intermediary.cluster.tier import shares, tier_partition

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "system" / "tier.yaml"
TIER: dict[str, Any] = {
    "members": ["127.0.0.1:8301", "127.0.0.1:8302"],
    "spatial": {"upstream": "ws://127.0.0.1:8200/", "world_lo": [0, 0], "world_hi": [100, 50]},
}


def _tier(**changes: Any) -> dict[str, Any]:
    tier = copy.deepcopy(TIER)
    tier.update(changes)
    return {"intermediary_tiers": {"world": tier}}


def test_the_example_tier_is_read_with_its_cells() -> None:
    tier = load_config_file(EXAMPLE).intermediary_tiers["world"]
    assert len(tier.members) == 3 and tier.grid() == (6, 2)
    partition = tier_partition(tier)
    assert isinstance(partition, RegionPartition) and len(partition.slots) == 12
    assert [list(share) for share in shares(12, 3)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
    ]


def test_defaults_cut_the_first_axis_once_per_member_and_hash_takes_buckets() -> None:
    tier = load_config(_tier()).intermediary_tiers["world"]
    assert tier.grid() == (2, 1)
    by_hash = load_config(_tier(responsibility={"by": "hash", "buckets": 7}))
    assert tier_partition(by_hash.intermediary_tiers["world"]) == HashPartition(7)
    assert [len(share) for share in shares(7, 3)] == [3, 2, 2]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"members": []}, "intermediary_tiers.world.members"),
        ({"members": ["127.0.0.1:8301", "127.0.0.1:8301"]}, "listed twice"),
        ({"members": ["127.0.0.1:0"]}, "port in 1..65535"),
        ({"members": ["0.0.0.0:8301"]}, "travels in redirects"),
        ({"members": ["8301"]}, "expected HOST:PORT"),
        ({"responsibility": {"cells": [4]}}, "the world has 2 axes, so give 2 numbers"),
        ({"responsibility": {"cells": [0, 1]}}, "every axis needs at least one cell"),
        ({"responsibility": {"cells": [1, 1]}}, "1 slot(s) for 2 members"),
        ({"responsibility": {"by": "hash", "buckets": 1}}, "1 slot(s) for 2 members"),
        ({"responsibility": {"by": "cells"}}, "intermediary_tiers.world.responsibility.by"),
        ({"check_every": "0s"}, "check_every: must be more than 0s"),
        ({"spatial": {"upstream": "http://x/", "world_lo": [0, 0], "world_hi": [1, 1]}}, "ws://"),
        ({"replicas": 2}, "replicas"),
    ],
)
def test_a_tier_that_cannot_run_is_refused_naming_why(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(_tier(**changes))
    assert message in str(caught.value)


def test_a_bad_tier_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="tier name 'a b' may hold only"):
        load_config({"intermediary_tiers": {"a b": TIER}})
