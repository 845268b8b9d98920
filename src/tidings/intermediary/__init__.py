"""Intermediaries: live views of fast-changing state for very many subscribers (the Hadean
design, seed 001; issue 12).

An intermediary sits between a publisher of state (the event server, a spatial simulation)
and many subscribers. Each subscriber states what it wants to see; the intermediary keeps
three stores (claims 1, 4): the publisher store (subscriber -> its subscriptions, with
priority), the subscriber store (its own upstream subscriptions, which collectively cover
every subscriber's) and the state store, double-buffered so that generation never sees a
half-applied epoch ([147]-[151]). It subscribes upstream only for what is not covered
already, and generates each subscriber's view from its own state, at the rate and priority
the subscriber can take.

Modules, bottom first:

* :mod:`.geometry` -- spatial regions (boxes, spheres, sectors; 2D and 3D), validated, with
  vectorised containment over many entities;
* :mod:`.coverage` -- whether upstream regions cover a subscriber's, the uncovered part, and
  the upstream set a set of live subscriptions needs (exact, bounding box or margin);
* :mod:`.state` -- the columnar, double-buffered state store;
* :mod:`.scheduling` -- per-subscriber rates and the priority queue with aging;
* :mod:`.stores` -- the publisher store (subscriber -> subscriptions, priority,
  capabilities) and the subscriber store (upstream boxes), wired as claim 1 says;
* :mod:`.generation` -- a subscriber's view from the active state, transformed to its
  capabilities, as a binary frame (with the empty and unchanged frames);
* :mod:`.sqlviews` -- read-only SQL views parsed and checked with sqlglot and decomposed into
  primitive queries; :mod:`.primitives` -- whether upstream primitives cover a new one, and
  merging them; :mod:`.sqltables` -- the tables the views are evaluated on, in SQLite.

* :mod:`.process` -- the intermediary: the stores, state and scheduler wired together, fed by
  an :class:`~tidings.intermediary.process.Upstream`; epochs and generation rounds;
* :mod:`.simulation` -- a spatial simulation publisher (agents moving in 2D/3D) that sends
  each intermediary only the agents inside its boxes ([134]-[137]);
* :mod:`.transport` -- the WebSocket server subscribers connect to (JSON requests, binary
  frames, a latest-wins slot per connection); :mod:`.client` -- its Python subscriber client;
  :mod:`.webpage` -- the web page it serves that shows one subscriber's view as a moving map.
* :mod:`.patterns` -- exact coverage of hat event-type patterns by a union of upstream ones;
  :mod:`.rows` -- the row-change event convention that carries domain tables to SQL views;
  :mod:`.eventviews` -- event-type and SQL-view subscriptions, their upstream set and the
  double-buffered tables; :mod:`.chain` -- the event server as their upstream, through the
  public client.

Many intermediaries (claims 9, 11; [108]-[111]):

* :mod:`.responsibility` -- slots of responsibility, by region (grid cells) or by hash;
  :mod:`.directory` -- who owns which slot and where it listens (SQLite, shared);
* :mod:`.areas` -- each member's upstream cut to its cells, and views spanning several
  members' cells generated from their states together; :mod:`.peers` -- a member in
  another process as the source of its cells' part;
* :mod:`.cluster` -- a member: redirects requests it is not responsible for, hands
  subscriptions over; :mod:`.handover` -- the client that follows both, one stream per key;
* :mod:`.scaling` -- members of one process stepped together, split and merged under load.

It stands on the event model and the public client only: it does not reach into the
server's or the pipeline's internals.
"""
