"""One intermediary, transport-free: what it holds and how it serves its subscribers'
views (claim 1).

Bottom first: the state it generates views from, double-buffered and columnar
(:mod:`.batches` what upstream hands it, :mod:`.buffers` one copy of it, :mod:`.snapshot`
a reader's view of it, :mod:`.state` the store that swaps them at each epoch); which
subscriber to serve next (:mod:`.scheduling`); a view as a binary frame (:mod:`.generation`,
a whole round at once in :mod:`.roundgen`); relative subscriptions placed at their entities
(:mod:`.placements`); the publisher store (:mod:`.publisher_store`: who subscribed to what)
and the subscriber store (:mod:`.subscriber_store`: the upstream boxes covering it all),
wired together by the subscribe path (:mod:`.subscribe`); what an upstream in another
process has applied yet (:mod:`.applied`); and the intermediary itself, all of it wired to
an upstream (:mod:`.intermediary`).
"""
