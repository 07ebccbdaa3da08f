"""rsi_jax.models"""
