"""rsi_jax.env"""
