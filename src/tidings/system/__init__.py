"""A deployment as one system: the parts one ``tidings.yaml`` configures, checked together
and run together.

The parts (the relay, event servers with their streams, intermediaries) are each runnable
alone from the same file; this package knows them all at once: which parts a file describes,
whether they fit each other (ports, addresses, type prefixes, stream type maps, table feeds),
and how to run them on one machine as supervised child processes (``tidings run``).
"""
