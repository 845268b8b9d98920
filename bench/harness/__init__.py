"""What every benchmark in ``bench/`` shares, so that a figure means the same in each report.

Bottom up: where the checkout and the results folder are (``paths``); progress lines stamped
with the run's elapsed time (``progress``); the sizes a benchmark runs at and the command
line choosing them (``sizes``); one percentile and one way of judging goals (``figures``);
the CPU of the parts a benchmark measures and of every other process on the machine
meanwhile, since a busy machine slows every figure and the reports say so (``cpu``, and
``trees`` for a process tree sampled over time); scratch PostgreSQL databases
(``databases``); what the relay benchmarks read back from an outbox (``outbox``); the
servers a benchmark or a test starts (``processes``, which the tests import too); the
machine and code a report's figures come from (``machine``); the Markdown pieces of a report
(``markdown``); and the report itself, its phases and its files in ``bench/results/``
(``report``).

Import from the modules; this face re-exports nothing.
"""
