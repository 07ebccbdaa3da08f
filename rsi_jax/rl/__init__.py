"""rsi_jax.rl"""
