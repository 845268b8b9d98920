"""Regions of space and their coverage: the geometry every other part of the intermediaries
builds on, with nothing of an intermediary in it.

A subscriber asks for a region (a box, a sphere or a sector, 2D or 3D, possibly relative to
its own entity: :mod:`.geometry`); an intermediary subscribes upstream for boxes, and
:mod:`.coverage` decides whether boxes cover a region and which boxes to add when they do
not; :mod:`.coveredcells` answers the same question quickly for many moving regions against
one set of boxes; :mod:`.grid` finds which of many entity positions may lie in a box without
testing them all.
"""
