"""The errors a phase stops the run with: a broken invariant, a step with nothing to train on."""

from __future__ import annotations


class InvariantError(RuntimeError):
  """A property the method relies on does not hold; the run stops."""


class NoTrainableSamples(RuntimeError):
  """A step has nothing to train on (every prompt rejected, every episode an infrastructure failure, ...)."""
