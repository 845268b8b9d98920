"""Measuring the fan-out tier: the benchmark's and ``tidings fanout-demo``'s code.

:mod:`.fanout` runs a publisher, intermediaries and many subscribers and takes the figures;
the intermediaries run in :mod:`.intermediary_process` and the subscribers in
:mod:`.subscriber_process`, OS processes of their own, the subscribers reading frames on a
cheap receive path (:mod:`.wsreceive`); :mod:`.demo` says what a run measured, in words and
in a plot.
"""
