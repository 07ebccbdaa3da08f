"""rsi_jax: a JAX training stack for terminal agents (Recursive Self-Rewrite + Recursive Policy-Refine)."""

import os as _os

__version__ = "0.1.0"

# XLA:CPU's concurrency-optimized scheduler lets independent all-reduces of one SPMD program run in a different
# order on different (virtual) CPU devices; under load (one-batch-ahead rollouts sampling while the learner
# trains) the in-process rendezvous then deadlocks and XLA aborts the process ("Termination timeout for
# all reduce ..."): seen on a 2 x 2 CPU mesh in 2 of 2 tries (benchmarks/bench_pipeline.py), none in 7 with the scheduler off. The flag
# only affects CPU compilation. Set here, before JAX starts its backends; an explicit setting in XLA_FLAGS wins.
_FLAG = "xla_cpu_enable_concurrency_optimized_scheduler"
if _FLAG not in _os.environ.get("XLA_FLAGS", ""):
  _os.environ["XLA_FLAGS"] = f"{_os.environ.get('XLA_FLAGS', '')} --{_FLAG}=false".strip()
