"""The Eventer server of hat-event 0.8.5: the protocol clients register, query and subscribe by.

As with the Syncer (:mod:`tidings.server.syncer`), the protocol's server side is a package:
:mod:`.server` accepts connections and serves each client's requests in order, over the
engine (:class:`~tidings.server.async_engine.AsyncEngine`); :mod:`.registrations` pipelines
a connection's register requests through the write queue and answers them in request order;
:mod:`.query_replies` builds query replies of any size off the event loop, in bounded
memory; :mod:`.notify` encodes each stored batch once for all the subscribers it matches;
:mod:`.counters` keeps what the servers served, for the metrics.
"""
