"""rsi_jax.sampler — JetStream-style decode engine with continuous batching (SPEC §1).

* :class:`~rsi_jax.sampler.engine.Engine` (:func:`~rsi_jax.sampler.factory.build_engine`): ``init_decode_state``, ``prefill``,
  ``insert``, ``generate``, ``free`` over MaxText Qwen3's prefill / autoregressive KV-cache modes.
* :class:`~rsi_jax.sampler.server.SamplerServer` (``SamplerServer.from_config(cfg, actor_params)``): the
  thread-safe :class:`rsi_jax.policy.AsyncPolicy` the harness calls; continuous batching, stop conditions,
  versioned weight hot-swap (``update_weights``).
* :func:`~rsi_jax.sampler.sampling.sample_tokens`: per-row temperature / top-k / top-p / greedy with the
  base model's float32 logprobs.
"""
