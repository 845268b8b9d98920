"""A spatial simulation publisher: agents moving in a 2D or 3D world ([134]-[137]).

It is the upstream an intermediary subscribes to in the demo, the tests and the benchmark.
Agents have positions and velocities (numpy, ``float64[N, dim]``), move in straight lines
and bounce off the world's walls. Each intermediary connects through its own
:class:`SimulationFeed`: it subscribes to boxes, and per tick the publisher computes that
intermediary's relevant set ([134]-[137]: the agents inside the union of its boxes) and
hands it over as one :class:`~tidings.intermediary.node.batches.UpdateBatch`, with deletions for
the agents that left the union since the previous batch, so the intermediary's state holds
exactly the agents its boxes cover. Each batch carries the tick it brings the state to and
the publisher's wall-clock time of that tick (``time.time()`` when :meth:`Simulation.step`
ended), which every frame generated from it carries on, for the subscribers' staleness.
The feed counts the bytes it would send (the ids, positions and deletions arrays), for the
benchmark's upstream-bandwidth figure.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from tidings.errors import IntermediaryError
from tidings.intermediary.feed.wire import MAX_FEED_BOXES
from tidings.intermediary.node.batches import UpdateBatch
from tidings.intermediary.regions.geometry import Box
from tidings.intermediary.regions.grid import GridIndex

#: The most agents one simulation holds (a bound on memory, not a tuning knob).
MAX_AGENTS = 10_000_000


class Simulation:
    """``n`` agents in ``world`` (a :class:`Box`, 2D or 3D), ids ``0..n-1``, uniformly placed
    with random directions and speeds up to ``max_speed`` (units per second); ``seed`` makes
    a run reproducible."""

    def __init__(
        self,
        n: int,
        world: Box,
        *,
        max_speed: float = 1.0,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_AGENTS:
            raise IntermediaryError(f"simulation: n must be an int in [0, {MAX_AGENTS}], not {n!r}")
        if not isinstance(world, Box):
            raise IntermediaryError(f"simulation: world must be a Box, not {type(world).__name__}")
        if not (
            isinstance(max_speed, (int, float)) and math.isfinite(max_speed) and max_speed >= 0
        ):
            raise IntermediaryError(
                f"simulation: max_speed must be finite and >= 0, not {max_speed!r}"
            )
        self.world = world
        self.dim = world.dim
        rng = np.random.default_rng(seed)
        self._lo = np.asarray(world.lo, dtype=np.float64)
        self._hi = np.asarray(world.hi, dtype=np.float64)
        self.ids = np.arange(n, dtype=np.int64)
        self.positions = self._lo + rng.random((n, self.dim)) * (self._hi - self._lo)
        direction = rng.normal(size=(n, self.dim))
        norms = np.linalg.norm(direction, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        self.velocities = direction / norms * (rng.random((n, 1)) * max_speed)
        self.tick = 0
        #: The wall-clock time (``clock``, Unix seconds) the current tick was computed at.
        self.tick_time = 0.0
        self._clock = clock
        self.feeds: list[SimulationFeed] = []
        self._index: tuple[int, GridIndex] | None = None

    def step(self, dt: float) -> None:
        """Advance ``dt`` seconds: move every agent, reflecting off the walls (a step longer
        than the world is wide folds back as many times as needed)."""
        if not (isinstance(dt, (int, float)) and math.isfinite(dt) and dt >= 0):
            raise IntermediaryError(f"simulation: dt must be finite and >= 0, not {dt!r}")
        positions = self.positions + self.velocities * dt
        # Most agents stay inside: only the rows that left the world are reflected (two
        # passes over all agents instead of ten).
        out = np.flatnonzero(((positions < self._lo) | (positions > self._hi)).any(axis=1))
        if out.size:
            span = self._hi - self._lo
            moved = positions[out] - self._lo
            # Reflection as a triangle wave of period 2*span: position and velocity sign.
            phase = np.mod(moved, 2 * span)
            positions[out] = self._lo + np.where(phase > span, 2 * span - phase, phase)
            flip = (np.floor_divide(moved, span).astype(np.int64) % 2) != 0
            velocities = self.velocities.copy()
            velocities[out] = np.where(flip, -velocities[out], velocities[out])
            self.velocities = velocities
        self.positions = positions
        self.tick += 1
        self.tick_time = self._clock()

    def index(self) -> GridIndex:
        """The grid index of this tick's positions (built once per tick, shared by feeds)."""
        if self._index is None or self._index[0] != self.tick:
            self._index = (self.tick, GridIndex(self.positions))
        return self._index[1]

    def feed(self) -> SimulationFeed:
        """A new upstream connection for one intermediary (no boxes yet)."""
        feed = SimulationFeed(self)
        self.feeds.append(feed)
        return feed

    def drop_feed(self, feed: SimulationFeed) -> None:
        """Forget a feed whose intermediary went away (a feed not held is ignored)."""
        with contextlib.suppress(ValueError):
            self.feeds.remove(feed)


class SimulationFeed:
    """One intermediary's subscription to a :class:`Simulation`: its boxes (a multiset: the
    same box subscribed twice needs two unsubscribes) and the ids it was last sent. It
    implements the intermediary's ``Upstream`` protocol."""

    def __init__(self, simulation: Simulation) -> None:
        self.simulation = simulation
        self._boxes: list[Box] = []
        self._sent = np.empty(0, dtype=np.int64)
        self._followed = np.empty(0, dtype=np.int64)
        self.bytes_sent = 0
        self.batches = 0
        #: Operations asked (subscribe, unsubscribe, follow) and how many of them the
        #: latest batch reflects (:func:`.node.intermediary.requests_of`): all asked before
        #: it began.
        self.requested = 0
        self.applied = 0

    @property
    def boxes(self) -> tuple[Box, ...]:
        """The boxes subscribed now."""
        return tuple(self._boxes)

    def subscribe(self, boxes: Sequence[Box]) -> None:
        """Add ``boxes`` to the relevant set (from the next batch on)."""
        boxes = list(boxes)
        for box in boxes:
            if not isinstance(box, Box) or box.dim != self.simulation.dim:
                raise IntermediaryError(
                    f"simulation: expected {self.simulation.dim}D boxes, got {box!r}"
                )
        if len(self._boxes) + len(boxes) > MAX_FEED_BOXES:
            raise IntermediaryError(f"simulation: more than {MAX_FEED_BOXES} boxes on one feed")
        self._boxes.extend(boxes)
        self.requested += 1

    def unsubscribe(self, boxes: Sequence[Box]) -> None:
        """Remove one occurrence of each of ``boxes``; a box not subscribed is refused."""
        for box in boxes:
            try:
                self._boxes.remove(box)
            except ValueError:
                raise IntermediaryError(f"simulation: {box!r} is not subscribed") from None
        self.requested += 1

    @property
    def followed(self) -> frozenset[int]:
        """The entities sent wherever they are (see :meth:`follow`)."""
        return frozenset(int(entity) for entity in self._followed)

    def follow(self, entities: frozenset[int]) -> None:
        """Send these agents in every batch besides those in the boxes (replaces the set)."""
        if not all(type(e) is int and -(2**63) <= e < 2**63 for e in entities):
            raise IntermediaryError("simulation: follow expects int64 agent ids")
        self._followed = np.fromiter(entities, dtype=np.int64, count=len(entities))
        self.requested += 1

    def relevant(self) -> np.ndarray:
        """The row mask of the agents inside the union of the boxes or followed, now."""
        positions = self.simulation.positions
        index = self.simulation.index()
        mask = np.zeros(len(positions), dtype=bool)
        # A copy: the intermediary may subscribe from another thread meanwhile.
        boxes = tuple(self._boxes)
        if boxes:
            # Every box's cells gathered and tested in one pass (not a few calls per box).
            lo = np.array([box.lo for box in boxes])
            hi = np.array([box.hi for box in boxes])
            rows, owner, large = index.candidates_many(lo, hi)
            points = np.take(positions, rows, axis=0)
            lo, hi = np.take(lo, owner, axis=0), np.take(hi, owner, axis=0)
            mask[rows[np.all((points >= lo) & (points <= hi), axis=1)]] = True
            for box, whole in zip(boxes, large.tolist(), strict=True):
                if whole:
                    mask |= box.contains(positions)
        followed = self._followed  # read once: follow() may replace it from another thread
        if followed.size:
            mask |= np.isin(self.simulation.ids, followed)
        return mask

    def batch(self) -> UpdateBatch:
        """This tick's update for the intermediary: the relevant agents' positions, and the
        deletion of those sent before that are no longer relevant, numbered with the tick."""
        sim = self.simulation
        self.applied = self.requested  # before the boxes are read: never more than it holds
        mask = self.relevant()
        ids = sim.ids[mask]
        positions = sim.positions[mask]
        gone = np.setdiff1d(self._sent, ids, assume_unique=True)
        self._sent = ids
        self.bytes_sent += ids.nbytes + positions.nbytes + gone.nbytes
        self.batches += 1
        return UpdateBatch(
            ids=ids, positions=positions, delete=gone, tick=sim.tick, tick_time=sim.tick_time
        )
