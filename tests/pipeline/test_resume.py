"""Resume with real processes: ``python -m rsi_jax.train`` preempted by SIGTERM (checkpoint, exit 0), killed
by SIGKILL at a step boundary of RPR (possibly while a checkpoint is being written), and rerun, ends with
actor and critic weights bitwise equal to an uninterrupted run (``rollout.deterministic``)."""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rsi_jax.config import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.docker]

ARGS = ["--config=configs/smoke.yml", "pipeline.phases=[rsr1, rpr1]", "rollout.deterministic=true",
        "rollout.max_staleness=0",
        "run.progress=false", "mesh.ici_fsdp_parallelism=2", "mesh.ici_tensor_parallelism=2",
        "rollout.global_batch=2", "rollout.requested=3", "env.max_tasks=2", "env.max_turns=2",
        "rollout.max_new_tokens=16", "pipeline.sft_epochs=2", "pipeline.rollout_steps=3",
        "pipeline.critic_only_steps=1", "pipeline.checkpoint_every=1"]


def _start(out: Path, name: str, *extra: str) -> subprocess.Popen:
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
             PYTHONUNBUFFERED="1")
  return subprocess.Popen([sys.executable, "-m", "rsi_jax.train", *ARGS, f"run.output_dir={out}",
                           f"run.name={name}", *extra], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _records(run_dir: Path) -> list[dict]:
  f = run_dir / "metrics.jsonl"
  if not f.exists():
    return []
  out = []
  for line in f.read_text().splitlines():
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError:
      pass
  return out


def _signal_after(p: subprocess.Popen, run_dir: Path, phase: str, step: int, sig, timeout: float = 600):
  """Send ``sig`` once ``run_dir``'s metrics record ``phase`` ``step``; return (rc, stdout, stderr)."""
  st = _stop_when(p, lambda: _has_step(run_dir, phase, step), sig, timeout=timeout)
  return st["rc"], st["out"], st["err"]


def _finish(p):
  out, err = p.communicate(timeout=900)
  assert p.returncode == 0, f"rc {p.returncode}\n{out}\n{err[-3000:]}"
  return out, err


def _assert_same_final_weights(run_a: Path, run_b: Path):
  """The two runs' final actor and critic are bitwise equal."""
  a, b = _final_params(run_a), _final_params(run_b)
  for role in ("actor", "critic"):
    la, lb = jax.tree_util.tree_leaves(a[role]), jax.tree_util.tree_leaves(b[role])
    assert len(la) == len(lb) > 0
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb)), role


def _final_params(run_dir: Path) -> dict:
  final = run_dir / json.loads((run_dir / "lineage.json").read_text())[-1]["output"]
  return {k: ocp.StandardCheckpointer().restore(final / k) for k in ("actor", "critic")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, docker_client):
  out = tmp_path_factory.mktemp("resume")
  a_out, a_err = _finish(_start(out, "a"))  # uninterrupted
  b = out / "b"
  # preempted inside RSR-1 (the resumed phase continues Q_clean's grain iterator from the checkpoint), then
  # killed inside RPR-1
  rc, term_out, _ = _signal_after(_start(out, "b"), b, "rsr1", 2, signal.SIGTERM)
  preempted_at = max(r["step"] for r in _records(b) if r["phase"] == "rsr1")
  # resuming without the phase folder that holds the Q_clean the checkpoint trained on is refused, naming it
  (b / "phases" / "rsr1").rename(b / "phases" / "rsr1.away")
  try:
    lost = _start(out, "b")
    lost_out, lost_err = lost.communicate(timeout=600)
  finally:
    (b / "phases" / "rsr1.away").rename(b / "phases" / "rsr1")
  # resuming with another task pool is refused (the checkpoint's data order belongs to its pool), changing nothing,
  # even where a config change is allowed
  other = _start(out, "b", "env.max_tasks=1", "run.allow_config_change=true")
  other_out, other_err = other.communicate(timeout=600)
  rc_kill, _, _ = _signal_after(_start(out, "b"), b, "rpr1", 2, signal.SIGKILL)
  b_out, _ = _finish(_start(out, "b"))
  # run c, stopped three times at moments that are not step boundaries: SIGTERM inside the RSR funnel (its
  # episode containers up), Ctrl-C at the rsr1 -> rpr1 boundary, SIGTERM at a random moment inside an RPR step
  c = out / "c"
  stops = {"funnel": _stop_when(_start(out, "c"), lambda: _containers(docker_client, "c"), signal.SIGTERM),
           "boundary": _stop_when(_start(out, "c"), lambda: _has_step(c, "rsr1", 4), signal.SIGINT)}
  stops["boundary"]["records"] = [(r["phase"], r["step"]) for r in _records(c)]
  delay = random.Random(os.getpid()).uniform(0.0, 2.0)
  stops["mid_step"] = _stop_when(_start(out, "c"), lambda: _has_step(c, "rpr1", 1), signal.SIGTERM, delay)
  stops["mid_step"]["delay"] = delay
  c_out, _ = _finish(_start(out, "c"))
  # run d: a copy of the finished run b whose last rpr1 step is corrupted (4 KiB of flipped bytes) and whose
  # lineage lost its rpr1 entry; resumed while b's checkpoints are out of the way, it must read its own
  # checkpoints (paths relative to the run folder), refuse step 3, fall back to step 2 and redo step 3
  d = out / "d"
  shutil.copytree(b, d)
  lineage = json.loads((d / "lineage.json").read_text())
  (d / "lineage.json").write_text(json.dumps([e for e in lineage if e["phase"] != "rpr1"]))
  data = max((f for f in (d / "checkpoints" / "rpr1" / "3" / "actor").rglob("*") if f.is_file()),
             key=lambda f: f.stat().st_size)
  raw = bytearray(data.read_bytes())
  mid = len(raw) // 2
  raw[mid:mid + 4096] = bytes(x ^ 0xFF for x in raw[mid:mid + 4096])
  data.write_bytes(bytes(raw))
  (b / "checkpoints").rename(b / "checkpoints.away")
  try:
    d_out, _ = _finish(_start(out, "d"))
  finally:
    (b / "checkpoints.away").rename(b / "checkpoints")
  return {"out": out, "a_out": a_out, "a_err": a_err, "term_rc": rc, "term_out": term_out,
          "preempted_at": preempted_at, "kill_rc": rc_kill, "b_out": b_out,
          "other_pool": (other.returncode, other_out + other_err), "lost_qclean": (lost.returncode, lost_out),
          "stops": stops, "c_out": c_out, "d_out": d_out,
          "containers_left": _containers(docker_client, "")}


def _has_step(run_dir: Path, phase: str, step: int) -> bool:
  return any(r["phase"] == phase and r["step"] == step for r in _records(run_dir))


def _containers(client, run_name: str) -> list:
  """Containers of runs named ``run_name`` ("" = any run of this module)."""
  from rsi_jax.env.sandbox import LABEL_RUN
  return [x for x in client.containers.list(all=True, filters={"label": LABEL_RUN}, ignore_removed=True)
          if x.labels.get(LABEL_RUN, "").rsplit("-", 1)[0] in ((run_name,) if run_name else ("a", "b", "c", "d"))]


def _stop_when(p: subprocess.Popen, cond, sig, delay: float = 0.0, timeout: float = 600) -> dict:
  """Send ``sig`` ``delay`` seconds after ``cond()`` first holds; the exit status, the seconds from the signal to
  the exit, and the output."""
  t0 = time.time()
  while not cond():
    if p.poll() is not None:
      out, err = p.communicate()
      raise AssertionError(f"run ended (rc {p.returncode}) before the moment to stop it:\n{out}\n{err[-3000:]}")
    if time.time() - t0 > timeout:
      p.kill()
      raise AssertionError(f"the moment to stop the run did not come within {timeout}s")
    time.sleep(0.05)
  time.sleep(delay)
  t_sig = time.time()
  p.send_signal(sig)
  out, err = p.communicate(timeout=600)
  return {"rc": p.returncode, "seconds": time.time() - t_sig, "out": out, "err": err}


def test_resuming_on_another_task_pool_is_refused(runs):
  rc, out = runs["other_pool"]
  assert rc == 2
  assert re.search(r"rsr1: its checkpoint at step \d+ was trained on another task pool \(digest [0-9a-f]{16}\) "
                   r"than env\.tasks_dir / env\.max_tasks now give \([0-9a-f]{16}, 1 tasks\)", out), out[-3000:]


def test_resuming_an_rsr_phase_needs_the_q_clean_it_trained_on(runs):
  rc, out = runs["lost_qclean"]
  assert rc == 1
  assert re.search(r"run stopped: InvariantError: rsr1: its checkpoint at step \d+ trained on the Q_clean of "
                   r"\S+/b/phases/rsr1, which is missing: restore that folder", out), out[-3000:]


def test_a_resumed_rsr_phase_records_the_actor_it_started_from(runs):
  """The lineage of the run preempted inside RSR-1 names the same input actor as the uninterrupted run (not the
  mid-phase actor the resumed attempt continued with)."""
  la = json.loads((runs["out"] / "a" / "lineage.json").read_text())
  lb = json.loads((runs["out"] / "b" / "lineage.json").read_text())
  assert la[0]["rsr"]["input_actor_digest"] == lb[0]["rsr"]["input_actor_digest"]


def test_sigterm_writes_a_checkpoint_and_exits_0(runs):
  assert runs["term_rc"] == 0, runs["term_out"]
  assert "preempted (SIGTERM): checkpoint written to" in runs["term_out"]
  step = runs["preempted_at"]
  assert step in (2, 3)
  assert f"checkpoints/rsr1/{step}" in runs["term_out"]


def test_sigkill_and_rerun_end_bitwise_equal_to_an_uninterrupted_run(runs):
  assert runs["kill_rc"] == -signal.SIGKILL
  assert "resuming after step" in runs["b_out"]
  _assert_same_final_weights(runs["out"] / "a", runs["out"] / "b")
  lin_a = json.loads((runs["out"] / "a" / "lineage.json").read_text())
  lin_b = json.loads((runs["out"] / "b" / "lineage.json").read_text())
  assert [(e["actor_digest"], e["critic_digest"]) for e in lin_a] == \
      [(e["actor_digest"], e["critic_digest"]) for e in lin_b]
  # the resumed run's metrics hold each step once, with the same rewards as the uninterrupted run
  ra, rb = _records(runs["out"] / "a"), _records(runs["out"] / "b")
  assert [(r["phase"], r["step"]) for r in rb] == [(r["phase"], r["step"]) for r in ra] == [
      ("rsr1", 1), ("rsr1", 2), ("rsr1", 3), ("rsr1", 4), ("rpr1", 1), ("rpr1", 2), ("rpr1", 3)]
  assert [r.get("loss") for r in rb] == [r.get("loss") for r in ra]


def test_console_shows_step_lines_not_library_chatter(runs):
  out, err = runs["a_out"], runs["a_err"]
  assert re.search(r"^\[rpr1 3/3\] joint ", out, re.M) and re.search(r"^\[rsr1 4/4\] sft ", out, re.M)
  for where in (out, err):
    # no absl / XLA log lines ("I1201 06:02:48.4 ... file.py:861] ...") and no Orbax messages
    assert not re.search(r"^[IWEF]\d{4} \d\d:\d\d|\.(py|cc):\d+\]", where, re.M), where[-2000:]
    assert "CheckpointManager" not in where and "orbax-checkpoint" not in where
  assert "lineage" in out and "tensorboard" in out and "plots" in out and "metrics.jsonl" in out
  log = (runs["out"] / "a" / "train.log").read_text()
  assert re.search(r"^I\d{4} .*checkpoint", log, re.M)  # the chatter went to the run's log file


BUDGET = 25.0  # run.preempt_budget_s's default (a preemption notice gives about 30 s)


def test_sigterm_inside_the_rsr_funnel_stops_at_once(runs):
  st = runs["stops"]["funnel"]
  assert st["rc"] == 0, st["out"] + st["err"][-3000:]
  assert st["seconds"] < BUDGET, st
  assert ("preempted (SIGTERM): no step of the phase had finished (it starts again from init(seed=0)); rerun the "
          "same command to resume") in st["out"], st["out"]
  assert "Traceback" not in st["out"] + st["err"]


def test_ctrl_c_at_a_phase_boundary_stops_before_the_next_phase(runs):
  st = runs["stops"]["boundary"]
  assert st["rc"] == 130, st["out"] + st["err"][-3000:]
  assert st["seconds"] < BUDGET, st
  assert re.search(r"preempted \(Ctrl-C\): checkpoint written to \S+/c/checkpoints/rsr1/4;", st["out"]), st["out"]
  # nothing of rpr1 ran: the notice was seen at the boundary, not one step into the next phase
  assert st["records"] == [("rsr1", 1), ("rsr1", 2), ("rsr1", 3), ("rsr1", 4)]


def test_sigterm_inside_a_step_aborts_its_episodes_within_the_budget(runs):
  st = runs["stops"]["mid_step"]
  assert st["rc"] == 0, st["out"] + st["err"][-3000:]
  assert st["seconds"] < BUDGET, st
  assert re.search(r"preempted \(SIGTERM\): checkpoint written to \S+/c/checkpoints/rpr1/[12];", st["out"])


def test_stopped_three_times_the_run_ends_bitwise_equal_to_an_uninterrupted_one(runs):
  assert "resuming after step" in runs["c_out"]
  _assert_same_final_weights(runs["out"] / "a", runs["out"] / "c")
  ra, rc = _records(runs["out"] / "a"), _records(runs["out"] / "c")
  assert [(r["phase"], r["step"], r.get("loss")) for r in rc] == [(r["phase"], r["step"], r.get("loss")) for r in ra]
  assert runs["containers_left"] == []  # no container of any of these runs is left


def test_a_copied_run_with_a_corrupted_newest_checkpoint_falls_back_and_ends_bitwise_equal(runs):
  out = runs["d_out"]
  assert re.search(r"^\[rpr1\] step 3 was refused \(checkpoint \S+/d/checkpoints/rpr1/3: item 'actor' .+\); kept as "
                   r"\S+/d/checkpoints/rpr1/3\.refused-", out, re.M), out
  assert re.search(r"^\[rpr1\] resuming after step 2 \(\S+/d/checkpoints/rpr1/2\)", out, re.M), out
  _assert_same_final_weights(runs["out"] / "a", runs["out"] / "d")
  assert str(runs["out"] / "b") not in out  # nothing of the original folder was read or named
