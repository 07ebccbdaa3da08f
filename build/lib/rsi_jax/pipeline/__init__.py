"""rsi_jax.pipeline"""
