"""Resume with real processes: ``python -m rsi_jax.train`` preempted by SIGTERM (checkpoint, exit 0), killed
by SIGKILL inside the RSR funnel or at a step boundary of RPR (possibly while a checkpoint is being written),
stopped during an in-training evaluation or inside a critic-seed step, and rerun, ends with actor and critic
weights bitwise equal to an uninterrupted run (``rollout.deterministic``)."""

import concurrent.futures
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
  # run a, uninterrupted, runs beside the stops of run b (its own folder and containers)
  a = concurrent.futures.ThreadPoolExecutor(1).submit(_finish, _start(out, "a"))
  b = out / "b"
  # killed inside the RSR funnel once it has recorded some of its work (episode containers up), preempted inside
  # RSR-1 (the resumed phase continues Q_clean's grain iterator from the checkpoint), then killed inside RPR-1
  funnel_kill = _stop_when(_start(out, "b"), lambda: _funnel_records(b) and _containers(docker_client, "b"),
                           signal.SIGKILL)
  funnel_kill["records"] = _funnel_records(b)
  funnel_kill["manifest"] = (b / "phases" / "rsr1" / "rsr_manifest.json").exists()
  rc, term_out, _ = _signal_after(_start(out, "b"), b, "rsr1", 2, signal.SIGTERM)
  funnel_kill["rerun_manifest"] = json.loads((b / "phases" / "rsr1" / "rsr_manifest.json").read_text())
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
  # run c, stopped four times at moments that are not step boundaries: SIGTERM inside the RSR funnel (its
  # episode containers up), SIGTERM during the evaluation of the starting actor (the funnel done, the
  # evaluation's containers up), Ctrl-C at the rsr1 -> rpr1 boundary, SIGTERM at a random moment inside an RPR step
  c = out / "c"
  stops = {"funnel": _stop_when(_start(out, "c"), lambda: _containers(docker_client, "c"), signal.SIGTERM)}
  stops["eval"] = _stop_when(_start(out, "c"), lambda: ((c / "phases" / "rsr1" / "rsr_manifest.json").exists()
                                                         and _containers(docker_client, "c")), signal.SIGTERM)
  stops["eval"].update(records=_records(c), evaluated=(c / "eval" / "base" / "0" / "summary.json").exists(),
                       containers=_containers(docker_client, "c"))
  stops["boundary"] = _stop_when(_start(out, "c"), lambda: _has_step(c, "rsr1", 4), signal.SIGINT)
  stops["boundary"]["records"] = [(r["phase"], r["step"]) for r in _records(c)]
  delay = random.Random(os.getpid()).uniform(0.0, 2.0)
  stops["mid_step"] = _stop_when(_start(out, "c"), lambda: _has_step(c, "rpr1", 1), signal.SIGTERM, delay)
  stops["mid_step"].update(delay=delay, records=[(r["phase"], r["step"]) for r in _records(c)])
  c_out, _ = _finish(_start(out, "c"))
  # run d: a copy of the finished run b whose last rpr1 step is corrupted (4 KiB of flipped bytes) and whose
  # lineage lost its rpr1 entry; resumed while b's checkpoints are out of the way, it must read its own
  # checkpoints (paths relative to the run folder), refuse step 3, fall back to step 2 and redo step 3. It is
  # resumed with an evaluation every 2 steps, so it first evaluates step 2 (no earlier attempt did): SIGTERM
  # while that evaluation runs, then the rerun evaluates step 2 again before it redoes step 3
  a_out, a_err = a.result()
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
  d_args = ("pipeline.eval_every=2", "run.allow_config_change=true")
  try:
    d_stop = _stop_when(_start(out, "d", *d_args), lambda: _containers(docker_client, "d"), signal.SIGTERM)
    d_stop.update(evaluated=(d / "eval" / "rpr1" / "2").exists(), records=_records(d),
                  containers=_containers(docker_client, "d"))
    d_out, _ = _finish(_start(out, "d", *d_args))
  finally:
    (b / "checkpoints.away").rename(b / "checkpoints")
  return {"out": out, "a_out": a_out, "a_err": a_err, "term_rc": rc, "term_out": term_out,
          "preempted_at": preempted_at, "kill_rc": rc_kill, "b_out": b_out, "funnel_kill": funnel_kill,
          "other_pool": (other.returncode, other_out + other_err), "lost_qclean": (lost.returncode, lost_out),
          "stops": stops, "c_out": c_out, "d_stop": d_stop, "d_out": d_stop["out"] + d_out, "d_rerun": d_out,
          "containers_left": _containers(docker_client, "")}


def _has_step(run_dir: Path, phase: str, step: int) -> bool:
  return any(r["phase"] == phase and r["step"] == step for r in _records(run_dir))


def _funnel_records(run_dir: Path, phase: str = "rsr1") -> list[str]:
  """The RSR funnel's progress records on disk (``<stage>/<index>.json.gz``)."""
  d = run_dir / "phases" / phase / "progress"
  return sorted(str(f.relative_to(d)) for f in d.glob("*/*.json.gz")) if d.exists() else []


def _eval_records(run_dir: Path) -> list[tuple]:
  f = run_dir / "eval" / "metrics.jsonl"
  return [(r["phase"], r["step"]) for r in map(json.loads, f.read_text().splitlines())] if f.exists() else []


def _containers(client, run_name: str) -> list:
  """Containers of runs named ``run_name`` ("" = any run of this module)."""
  from rsi_jax.env.reaper import LABEL_RUN
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


def test_sigkill_inside_the_rsr_funnel_resumes_from_its_records(runs):
  """SIGKILL while the funnel's episodes run, some of its work recorded: the rerun continues from the records
  (``progress.restored`` in its manifest) and the run ends as the uninterrupted one: the same funnel stages and
  Q_clean, final weights bitwise equal (run b)."""
  k = runs["funnel_kill"]
  assert k["rc"] == -signal.SIGKILL, k["out"] + k["err"][-3000:]
  assert k["records"] and not k["manifest"], k["records"]  # killed mid-funnel
  restored = k["rerun_manifest"]["progress"]["restored"]
  assert sum(restored.values()) >= 1, restored
  a, b = runs["out"] / "a", runs["out"] / "b"
  la, lb = (json.loads((r / "lineage.json").read_text()) for r in (a, b))
  assert lb[0]["rsr"]["stages"] == la[0]["rsr"]["stages"]
  qa, qb = ([{k: v for k, v in json.loads(line).items() if k != "episode_id"}
             for line in (r / "phases" / "rsr1" / "q_clean.jsonl").read_text().splitlines()] for r in (a, b))
  assert qa == qb and qa
  with np.load(a / "phases" / "rsr1" / "q_clean.npz") as za, np.load(b / "phases" / "rsr1" / "q_clean.npz") as zb:
    assert sorted(za.files) == sorted(zb.files)
    assert all(np.array_equal(za[f], zb[f]) for f in za.files)
  _assert_same_final_weights(a, b)


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


def test_sigterm_during_an_evaluation_aborts_it_and_the_rerun_evaluates_again(runs):
  """SIGTERM while the starting actor is evaluated (eval.tasks_dir): its episodes are aborted, nothing of it is
  written (no summary a rerun would take as done, no eval/metrics.jsonl record), exit 0 at once with the
  preemption line; the rerun evaluates it again and the run's evaluations are the uninterrupted run's."""
  st = runs["stops"]["eval"]
  assert st["rc"] == 0, st["out"] + st["err"][-3000:]
  assert st["seconds"] < BUDGET, st
  assert ("preempted (SIGTERM): no step of the phase had finished (it starts again from init(seed=0)); rerun the "
          "same command to resume") in st["out"], st["out"]
  assert "Traceback" not in st["out"] + st["err"]
  assert not st["evaluated"] and st["records"] == [] and st["containers"] == []
  c = runs["out"] / "c"
  assert (c / "eval" / "base" / "0" / "summary.json").exists()
  assert _eval_records(c) == _eval_records(runs["out"] / "a") == [("base", 0), ("rsr1", 4), ("rpr1", 3)]


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
  # the interrupted step did not run to its end: step 1 is the newest on storage, step 2 never logged
  assert re.search(r"preempted \(SIGTERM\): checkpoint written to \S+/c/checkpoints/rpr1/1;", st["out"]), st["out"]
  assert st["records"][-1] == ("rpr1", 1), st["records"]


def test_stopped_four_times_the_run_ends_bitwise_equal_to_an_uninterrupted_one(runs):
  assert "resuming after step" in runs["c_out"]
  _assert_same_final_weights(runs["out"] / "a", runs["out"] / "c")
  ra, rc = _records(runs["out"] / "a"), _records(runs["out"] / "c")
  assert [(r["phase"], r["step"], r.get("loss")) for r in rc] == [(r["phase"], r["step"], r.get("loss")) for r in ra]
  assert runs["containers_left"] == []  # no container of any of these runs is left


def test_sigterm_during_the_evaluation_of_a_step_keeps_the_step_and_the_rerun_evaluates_it(runs):
  """Run d, resumed after rpr1 step 2 with an evaluation every 2 steps, evaluates step 2 first: SIGTERM then
  aborts it (nothing of it written), exit 0 naming the step's checkpoint; the rerun evaluates step 2 again before
  it redoes step 3 (and ends bitwise equal to the uninterrupted run: the next test)."""
  st = runs["d_stop"]
  assert st["rc"] == 0, st["out"] + st["err"][-3000:]
  assert st["seconds"] < BUDGET, st
  assert re.search(r"preempted \(SIGTERM\): checkpoint written to \S+/d/checkpoints/rpr1/2;", st["out"]), st["out"]
  assert "Traceback" not in st["out"] + st["err"]
  assert not st["evaluated"] and st["containers"] == []
  assert [(r["phase"], r["step"]) for r in st["records"]][-1] == ("rpr1", 2)  # step 3 not begun
  out, d = runs["d_rerun"], runs["out"] / "d"
  assert re.search(r"^\[rpr1\] resuming after step 2 .*^\[rpr1\] eval after step 2 on tasks .*^\[rpr1 3/3\] ", out,
                   re.M | re.S), out
  assert (d / "eval" / "rpr1" / "2" / "summary.json").exists()
  assert _eval_records(d) == [("base", 0), ("rsr1", 4), ("rpr1", 2), ("rpr1", 3)]


def test_a_copied_run_with_a_corrupted_newest_checkpoint_falls_back_and_ends_bitwise_equal(runs):
  out = runs["d_out"]
  assert re.search(r"^\[rpr1\] step 3 was refused \(checkpoint \S+/d/checkpoints/rpr1/3: item 'actor' .+\); kept as "
                   r"\S+/d/checkpoints/rpr1/3\.refused-", out, re.M), out
  assert re.search(r"^\[rpr1\] resuming after step 2 \(\S+/d/checkpoints/rpr1/2\)", out, re.M), out
  _assert_same_final_weights(runs["out"] / "a", runs["out"] / "d")
  assert str(runs["out"] / "b") not in out  # nothing of the original folder was read or named


# the critic seed on its own: two critic-only rollout steps (2 tasks, 2 epochs) from the initial actor, evaluated
# after every step (the frozen actor: measured once, at the start)
SEED_ARGS = ["pipeline.phases=[critic_seed]", "pipeline.critic_seed_epochs=2", "pipeline.eval_every=1"]


@pytest.fixture(scope="module")
def seed_runs(tmp_path_factory, docker_client):
  """Run s uninterrupted; run t stopped by SIGTERM at a random moment while step 2's episodes run, then rerun."""
  out = tmp_path_factory.mktemp("seed")
  _finish(_start(out, "s", *SEED_ARGS))
  t = out / "t"
  delay = random.Random(os.getpid()).uniform(0.0, 1.0)
  st = _stop_when(_start(out, "t", *SEED_ARGS),
                  lambda: _has_step(t, "critic_seed", 1) and _containers(docker_client, "t"), signal.SIGTERM, delay)
  st.update(delay=delay, records=[(r["phase"], r["step"]) for r in _records(t)],
            containers=_containers(docker_client, "t"))
  t_out, _ = _finish(_start(out, "t", *SEED_ARGS))
  return {"out": out, "stop": st, "t_out": t_out}


def test_sigterm_inside_a_critic_seed_step_and_rerun_end_bitwise_equal(seed_runs):
  st = seed_runs["stop"]
  assert st["rc"] == 0, st["out"] + st["err"][-3000:]
  assert st["seconds"] < BUDGET, st
  assert re.search(r"preempted \(SIGTERM\): checkpoint written to \S+/t/checkpoints/critic_seed/1;", st["out"]), \
      st["out"]
  assert "Traceback" not in st["out"] + st["err"]
  assert st["records"] == [("critic_seed", 1)] and st["containers"] == []  # step 2's episodes aborted and removed
  assert re.search(r"^\[critic_seed\] resuming after step 1 ", seed_runs["t_out"], re.M), seed_runs["t_out"]
  s, t = seed_runs["out"] / "s", seed_runs["out"] / "t"
  _assert_same_final_weights(s, t)
  rs, rt = _records(s), _records(t)
  assert [(r["phase"], r["step"], r.get("loss")) for r in rt] == [(r["phase"], r["step"], r.get("loss")) for r in rs]
  assert len(rs) == 2
  # the resumed attempt does not measure the frozen actor again: an earlier attempt's evaluation stands for it
  assert re.search(r"^\[critic_seed\] eval after step 1 skipped: the actor is the one evaluated at base step 0 ",
                   seed_runs["t_out"], re.M), seed_runs["t_out"]
  assert _eval_records(t) == _eval_records(s) == [("base", 0)]
