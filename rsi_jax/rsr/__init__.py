"""rsi_jax.rsr"""
