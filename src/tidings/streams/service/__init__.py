"""A running stream: the FTN18 functions, the HTTP and WebSocket application that carries
them, and the runner that starts the streams inside ``tidings server``.

Events reach consumers through a shared in-memory feed (the store when a consumer is further
behind), polled or pushed: the push sessions are tracked per stream. Callers are
authenticated against the configured password hashes, and may do what their users'
permissions allow (:mod:`.access`): the streams, components and types they consume, the
data filter applied before anything is sent (:mod:`.selection`), ``addEvent``; refusals are
counted per stream (:mod:`.refusals`).
"""
