"""Start-up faults of ``python -m rsi_jax.train``: each stops before any model is built, with exit 2 and one line
naming the key or the file, and leaves nothing that blocks the corrected command."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsi_jax.config import CONFIG_DIR, REPO_ROOT, dump_config, load_config

HF = Path(REPO_ROOT) / "tests" / "models" / "fixtures" / "hf_qwen3_tied"
ENV = dict(XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")


def _train(*args, config="configs/smoke.yml", timeout=120):
  return subprocess.run([sys.executable, "-m", "rsi_jax.train", f"--config={config}", "run.progress=false", *args],
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **ENV))


def _one_line(p) -> str:
  lines = [x for x in p.stderr.splitlines() if x.strip()]
  assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])
  return lines[0]


def test_an_empty_config_file_is_an_error(tmp_path):
  f = tmp_path / "run.yml"
  f.write_text("# nothing set yet\n")
  line = _one_line(_train(config=str(f)))
  assert line == f"config error: config file {f} is empty (start from configs/smoke.yml or configs/base.yml)"


@pytest.mark.parametrize("where", ["gs//bucket/runs", "gs:/bucket/runs", "gs:bucket"])
def test_an_object_store_url_with_a_typo_is_an_error(tmp_path, where):
  p = subprocess.run([sys.executable, "-m", "rsi_jax.train", f"--config={CONFIG_DIR}/smoke.yml", f"run.output_dir={where}"],
                     cwd=tmp_path, capture_output=True, text=True, timeout=120,
                     env=dict(os.environ, **ENV, PYTHONPATH=REPO_ROOT))
  assert "run.output_dir" in _one_line(p) and "gs:// URL with a typo" in p.stderr
  assert list(tmp_path.iterdir()) == []  # nothing trained into ./gs/... of the current directory


def test_an_output_folder_that_cannot_be_written_is_refused_before_the_models(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  line = _one_line(_train(f"run.output_dir={blocker}/runs"))
  assert line == f"cannot start: run.output_dir: {blocker} is a file, not a folder (for {blocker}/runs/smoke)"


def _hf_copy(tmp_path, name, change):
  d = tmp_path / name
  shutil.copytree(HF, d)
  change(d)
  return d


def test_hf_folder_faults_name_the_file_before_the_models_and_leave_no_blocking_folder(tmp_path):
  out = tmp_path / "runs"
  line = _one_line(_train(f"run.output_dir={out}", "model.hf_path=/nonexistent"))
  assert line == "cannot start: model.hf_path: /nonexistent: no such folder"
  bad_json = _hf_copy(tmp_path, "json", lambda d: (d / "config.json").write_text('{"model_type": "qwen3",'))
  line = _one_line(_train(f"run.output_dir={out}", f"model.hf_path={bad_json}"))
  assert line.startswith(f"cannot start: model.hf_path: {bad_json}/config.json: not valid JSON: ")

  def drop_layers(d):
    c = json.loads((d / "config.json").read_text())
    del c["num_hidden_layers"]
    (d / "config.json").write_text(json.dumps(c))
  line = _one_line(_train(f"run.output_dir={out}", f"model.hf_path={_hf_copy(tmp_path, 'keys', drop_layers)}"))
  assert line == f"cannot start: model.hf_path: {tmp_path}/keys/config.json: lacks num_hidden_layers"
  # the folder's model differs from the config's (head_dim 32 vs the tiny model's 16)
  line = _one_line(_train(f"run.output_dir={out}", f"model.hf_path={HF}"))
  assert line.startswith("cannot start: model.hf_path: model.head_dim=16 does not match the HF folder (32)")

  def cut(d):
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
  broken = _hf_copy(tmp_path, "cut", cut)
  line = _one_line(_train(f"run.output_dir={out}", f"model.hf_path={broken}", "model.head_dim=32"))
  assert line.startswith(f"cannot start: model.hf_path: {broken}/model.safetensors: not a readable safetensors file")
  # none of these left a run behind: run.resume=never accepts the folder
  from rsi_jax.pipeline.run_folder import existing_run
  cfg = load_config(CONFIG_DIR / "smoke.yml", [f"run.output_dir={out}", "run.resume=never"])
  assert existing_run(cfg) == []


def _fake_run(out: Path, *overrides) -> Path:
  """A run folder as a run leaves it after some steps: its config, a lineage entry and metrics."""
  cfg = load_config(CONFIG_DIR / "smoke.yml", [f"run.output_dir={out}", *overrides])
  rd = out / "smoke"
  rd.mkdir(parents=True)
  (rd / "config.yml").write_text(dump_config(cfg))
  (rd / "metrics.jsonl").write_text(json.dumps({"phase": "rsr1", "kind": "rsr", "step": 1, "global_step": 1}) + "\n")
  return rd


def test_resuming_with_a_changed_config_is_refused_naming_the_keys(tmp_path):
  out = tmp_path / "runs"
  rd = _fake_run(out)
  before = (rd / "config.yml").read_text()
  p = _train(f"run.output_dir={out}", "rollout.global_batch=2", "actor_optim.learning_rate=3e-4")
  line = _one_line(p)
  assert line.startswith(f"cannot start: the config differs from the one this run was trained with ({rd}/config.yml) "
                         "in actor_optim.learning_rate: 0.0001 -> 0.0003; rollout.global_batch: 4 -> 2: ")
  assert "run.allow_config_change=true" in line
  assert (rd / "config.yml").read_text() == before and not list(rd.glob("config.*.yml"))
  # the console, resume settings and the folder's own location are not changes
  from rsi_jax.pipeline.run_folder import training_settings
  moved = load_config(CONFIG_DIR / "smoke.yml", [f"run.output_dir={tmp_path}/elsewhere", "run.log_level=debug",
                                                  "run.progress=false"])
  assert training_settings(dump_config(moved)) == training_settings(before)


def test_a_corrupted_lineage_is_named(tmp_path):
  out = tmp_path / "runs"
  rd = _fake_run(out)
  (rd / "lineage.json").write_text('[{"phase": "rsr1", "output": ')
  line = _one_line(_train(f"run.output_dir={out}"))
  assert line.startswith(f"cannot start: {rd}/lineage.json: unreadable (")


STOPPED = {  # what a stop signal before the first checkpoint prints (one line on stderr) and the exit status
    "SIGINT": (130, "interrupted (Ctrl-C): stopped before a checkpoint could be written; rerun the same command to "
                    "resume from the newest one"),
    "SIGTERM": (0, "preempted (SIGTERM): stopped before a checkpoint could be written; rerun the same command to "
                   "resume from the newest one")}


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_signal_during_start_up_is_one_line(tmp_path, sig):
  """Ctrl-C, or a preemption notice (SIGTERM) before the run's own handler is installed: one line, no traceback.
  A SIGTERM there ended the process by its default action (exit -15), or, once the environment layer had set its
  handler, was lost in a garbage-collection callback or reported as the error of the library it interrupted."""
  p = subprocess.Popen([sys.executable, "-m", "rsi_jax.train", "--config=configs/smoke.yml", "run.progress=false",
                        f"run.output_dir={tmp_path}"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env=dict(os.environ, **ENV))
  time.sleep(4)  # importing JAX / checking the task folders: before any checkpoint exists
  p.send_signal(getattr(signal, sig))
  out, err = p.communicate(timeout=60)
  rc, line = STOPPED[sig]
  assert p.returncode == rc, (out, err[-3000:])
  assert [x for x in err.splitlines() if x.strip()] == [line], err[-3000:]
  assert "Traceback" not in out + err


# What a loaded CI machine showed: the Ctrl-C landed while MaxText's imports built a pydantic model, and pydantic-core
# reported it as its own error ("SchemaError: Error building ... KeyboardInterrupt"), which the program took for a
# failure ("run failed: SchemaError", exit 1); a SIGTERM that landed while MaxText built its config came out as
# OmegaConf's "ConfigKeyError: 'NoneType' object has no attribute '_invalidate_flags_cache'". Here the same wrapping,
# at the same place in the start-up.
_WRAPPED_STOP = """
import pathlib, sys, time
from rsi_jax import cli, train
from rsi_jax.pipeline import driver

class Wrapping:
  def __init__(self, *a, **k):
    try:
      pathlib.Path(sys.argv[1], "ready").write_text("")
      time.sleep(60)  # the signal arrives here
    except (KeyboardInterrupt, SystemExit) as e:  # what pydantic-core or OmegaConf does with it
      raise RuntimeError(f"Error building validator: {type(e).__name__}: {e}") from None

driver.Driver = Wrapping
cli.keep_stop_signals()
sys.exit(train.run_program("configs/smoke.yml", ["run.progress=false", f"run.output_dir={sys.argv[1]}"]))
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_signal_that_a_library_wraps_in_its_own_error_is_still_that_signal(tmp_path, sig):
  p = subprocess.Popen([sys.executable, "-c", _WRAPPED_STOP, str(tmp_path)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env=dict(os.environ, **ENV))
  deadline = time.time() + 120
  while not (tmp_path / "ready").exists() and p.poll() is None and time.time() < deadline:
    time.sleep(0.1)
  assert (tmp_path / "ready").exists(), p.communicate(timeout=10)
  p.send_signal(getattr(signal, sig))
  out, err = p.communicate(timeout=60)
  rc, line = STOPPED[sig]
  assert p.returncode == rc, (out, err[-3000:])
  assert [x for x in err.splitlines() if x.strip()] == [line], err[-3000:]
