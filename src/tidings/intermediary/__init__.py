"""Intermediaries: live views of fast-changing state for very many subscribers (the Hadean
design, seed 001).

An intermediary sits between a publisher of state (the event server, a spatial simulation)
and many subscribers. Each subscriber states what it wants to see; the intermediary
subscribes upstream only for what is not covered already, keeps the state in a
double-buffered store, and generates each subscriber's view from its own state, at the rate
and priority the subscriber can take.

Its sub-packages, bottom first (each imports only those before it):

* :mod:`.regions` -- spatial regions, their coverage by upstream boxes, a grid over entities;
* :mod:`.node` -- one intermediary: its state, stores, scheduler and view generation;
* :mod:`.views` -- event-type and SQL-view subscriptions, and the event server as upstream;
* :mod:`.feed` -- the spatial feed's wire protocol and the intermediary's side of it;
* :mod:`.publisher` -- a simulated spatial publisher, in process or over the feed;
* :mod:`.serving` -- an intermediary served over WebSocket, its web pages, the service;
* :mod:`.client` -- subscribers in Python, to one intermediary or to a cluster;
* :mod:`.cluster` -- many intermediaries: responsibility, directory, redirects, handovers,
  split and merge, in one process or in several;
* :mod:`.measurement` -- the fan-out benchmark and demo.

It stands on the event model and the public client only: it does not reach into the
server's or the pipeline's internals. This package's own module imports nothing, so
importing one part (say :func:`.views.rows.emit_row` in a service) loads that part only.
"""
