"""rsi_jax.eval"""
