"""A stream's registered consumers: their acknowledged positions (kept in the store's
database), the retention those positions allow, and where each stream and consumer stands
(``tidings streams status``, ``unregister``, the Prometheus metrics).

Blocking code on the event store, called from worker threads by the running service and
directly by the command line.
"""
