"""Recursive Self-Rewrite (paper §2.1, Eq. 2–3, App. D; SPEC §5).

* :func:`strip_control` — C(τ), a trajectory without harness-control messages (:mod:`.control`);
* :func:`review` — the review gate q(x, b); :func:`screen_trajectory` — q_leak(τ) (:mod:`.review`);
* :func:`run_funnel` — discovery → planning → review → fresh execution → projection → Q_clean
  (:mod:`.funnel`), the RSR phase's data; ``python -m rsi_jax.rsr`` runs one RSR phase standalone.
"""

from rsi_jax.rsr.control import strip_control
from rsi_jax.rsr.review import Review, review, screen_trajectory

__all__ = ["Review", "review", "screen_trajectory", "strip_control"]
