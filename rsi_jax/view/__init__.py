"""The run browser: a local web page over a run folder (``python -m rsi_jax.view RUN_DIR``)."""
