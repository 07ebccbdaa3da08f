"""rsi_jax.sampler"""
