"""Event ids are version-7 UUIDs: unique, and ordered by the time they were made."""

from __future__ import annotations

import time
import uuid

from tidings.events.ids import new_id


def test_ids_are_rfc_version_7_uuids_carrying_the_time_and_unique() -> None:
    before = time.time_ns() // 1_000_000
    ids = [new_id() for _ in range(50_000)]
    after = time.time_ns() // 1_000_000

    assert len(set(ids)) == len(ids)
    for text in ids[:1000]:
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # canonical text: lowercase, hyphens
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert before <= parsed.int >> 80 <= after  # the first 48 bits: Unix milliseconds
    random_bits = {uuid.UUID(text).int & ((1 << 62) - 1) for text in ids}
    assert len(random_bits) == len(ids)  # the tail is random, not a counter that repeats


def test_an_id_made_in_a_later_millisecond_sorts_after_as_text_and_as_uuid() -> None:
    earlier = new_id()
    time.sleep(0.002)
    later = new_id()
    assert earlier < later
    assert uuid.UUID(earlier) < uuid.UUID(later)
