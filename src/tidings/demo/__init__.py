"""``tidings demo``: tidings end to end on a laptop, on the embedded default.

The default runs the whole chain (:mod:`.chain`): a bank (:mod:`.bank`) commits into its
outbox, the Spark relay delivers to an event server whose module (:mod:`.alerts`) reacts to
the relayed events, FTN18 consumers and intermediary subscribers read at the end
(:mod:`.watchers`), all configured by one file (:mod:`.deployment`), and a verdict judged
against what was committed (:mod:`.verdict`). ``--core`` runs the publishing core alone
(:mod:`.core`): outbox, relay, the embedded event store.
"""

from tidings.demo.chain import ChainResult, run_chain_demo
from tidings.demo.core import DemoResult, run_demo
from tidings.demo.verdict import percentile

__all__ = ["ChainResult", "DemoResult", "percentile", "run_chain_demo", "run_demo"]
