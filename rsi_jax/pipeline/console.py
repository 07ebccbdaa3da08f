"""The run's console: the lines a person reads while it trains (one per phase step) and its progress bars."""

from __future__ import annotations

import sys


class Console:
  """The lines a person reads: one per phase step, a header per phase, progress bars."""

  def __init__(self, out=None, err=None, progress: bool = True):
    self.out = out or sys.stdout
    self.err = err or sys.stderr
    self.progress = progress
    self._bar = None

  def line(self, text: str):
    if self._bar is not None:
      self._bar.clear()
    print(text, file=self.out, flush=True)
    if self._bar is not None:
      self._bar.refresh()

  def bar(self, total: int, initial: int, desc: str):
    from rsi_jax.log import progress
    self._bar = progress(total=total, desc=desc, enabled=self.progress, file=self.err)
    self._bar.update(initial)
    return self._bar

  def close_bar(self):
    if self._bar is not None:
      self._bar.close()
      self._bar = None


def format_step(name: str, i: int, n: int, m: dict) -> str:
  """``[rpr1 2/36] joint  reward 0.123  success 0.25  ...`` (the keys that the phase reported)."""
  def f(k, fmt, label=None):
    v = m.get(k)
    return f"{label or k} {format(v, fmt)}" if isinstance(v, (int, float)) else None
  if "nll_per_token" in m:
    parts = ["sft", f("nll_per_token", ".4f", "nll/token"), f("sft_tokens", "d", "tokens"),
             f("actor_grad_norm", ".3g", "|g|")]
  else:
    parts = ["joint" if m.get("train_actor") else "critic-only", f("reward_mean", ".3f", "reward"),
             f("success_mean", ".2f", "success"), f("turns_mean", ".1f", "turns"), f("loss", ".4f"),
             f("value/explained_variance", ".3f", "EV"), f("mismatch/abs_mean", ".1e", "logprob gap"),
             f("infra_failures", "d", "infra"), f("aborted_episodes", "d", "aborted")]
  if m.get("skipped_updates"):
    parts.append(f"SKIPPED {m['skipped_updates']} non-finite update(s)")
  parts.append(f("step_seconds", ".1f", "s"))
  return f"[{name} {i + 1}/{n}] " + "  ".join(p for p in parts if p)
