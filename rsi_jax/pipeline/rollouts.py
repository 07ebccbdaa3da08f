"""Moved to :mod:`rsi_jax.env.rollouts` (rollout collection is env-level: the RSR funnel and evaluation use it);
re-exported here until the last importers change."""

from rsi_jax.env.rollouts import EpisodeAborted, RolloutPolicy, TaskOrder, collect, derive_seed, pick_tasks

__all__ = ["EpisodeAborted", "RolloutPolicy", "TaskOrder", "collect", "derive_seed", "pick_tasks"]
