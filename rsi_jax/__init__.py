"""rsi_jax: a JAX training stack for terminal agents (Recursive Self-Rewrite + Recursive Policy-Refine)."""

__version__ = "0.1.0"
