"""A spatial publisher for demos, tests and measurements: agents moving in a 2D or 3D world
(:mod:`.simulation`), each intermediary fed the agents inside its boxes, in the same process
or served over the spatial feed's wire (:mod:`.server`; ``tidings intermediary simulate``).
It stands in for a real publisher of moving entities; nothing of an intermediary depends on
it.
"""
