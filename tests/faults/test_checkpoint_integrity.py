"""Checkpoints are verified on every restore: real Orbax checkpoints of the tiny actor / critic, corrupted on
disk (bits flipped in a data file, a truncated data file), restored onto a model of another size, or written
before digests were recorded. Every failure is one CheckpointError with a one-line message naming the
checkpoint folder and the item; resuming skips a refused newest step; the export command exits 2."""

import gc
import json
import logging
import os
import re
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rsi_jax.config import dump_config, load_config
from rsi_jax.models.actor import Actor
from rsi_jax.models.checkpoint import CheckpointError, params_digest, restore_params, save_params
from rsi_jax.models.critic import Critic
from rsi_jax.models.mesh import build_mesh
from rsi_jax.models.optim import TrainState, init_opt_state, make_optimizer, opt_state_shardings
from rsi_jax.pipeline.checkpoints import PhaseCheckpoints, opt_targets
from tests.models.test_checkpoint import TINY

MESH = ["mesh.ici_fsdp_parallelism=4", "mesh.ici_tensor_parallelism=2"]

# when one shard read fails, Orbax abandons the item's other pending reads; Python reports each as an
# exception ignored when the coroutine is collected (pytest: a warning per read), here and not in later tests
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]


@pytest.fixture(autouse=True)
def _collect_abandoned_reads():
  yield
  gc.collect()


@pytest.fixture(scope="module")
def tiny():
  """The tiny actor and critic (params, and the actor's AdamW state after one update: moments that are not
  zeros) on a 4 x 2 mesh of the fake devices."""
  cfg = load_config(None, TINY + MESH)
  actor = Actor(cfg, build_mesh(cfg))
  critic = Critic(cfg, actor.mesh)
  params = actor.init(jax.random.PRNGKey(0))
  cparams = critic.init_from_actor(params, jax.random.PRNGKey(1))
  opt = make_optimizer(cfg.actor_optim)
  opt_state = init_opt_state(opt, params, opt_state_shardings(opt, actor.abstract_params, actor.param_shardings,
                                                              actor.mesh))
  _, opt_state = opt.update(params, opt_state, params)
  return cfg, actor, critic, params, cparams, opt, opt_state


@pytest.fixture(scope="module")
def phase(tiny, tmp_path_factory):
  """A phase folder with steps 1, 2, 3 (actor, critic, actor_opt; the actor differs per step)."""
  _, actor, _, params, cparams, _, opt_state = tiny
  d = tmp_path_factory.mktemp("phase") / "rpr1"
  ckpts = PhaseCheckpoints(str(d), keep=5)
  for step in (1, 2, 3):
    moved = jax.tree.map(lambda x, s=step: x + s, params)
    ckpts.save(step, TrainState(moved, opt_state, cparams, None, step), {"phase": "rpr1", "seed": 0})
  ckpts.close()
  return d


def _targets(tiny):
  _, actor, critic, _, _, opt, _ = tiny
  return {"actor": actor.abstract_params, "critic": critic.abstract_params,
          "actor_opt": opt_targets(actor, opt), "critic_opt": opt_targets(critic, opt)}


def _copy(src, dst):
  shutil.copytree(src, dst)
  return dst


def _largest_data_file(item_dir) -> str:
  files = [os.path.join(r, f) for r, _, fs in os.walk(item_dir) for f in fs
           if os.path.basename(r) == "d"]  # the OCDBT data files (array chunks)
  return max(files, key=os.path.getsize)


def _flip(path, n=4096):
  """Invert ``n`` bytes in the middle of ``path`` (the file keeps its size)."""
  size = os.path.getsize(path)
  assert size > 2 * n, (path, size)
  with open(path, "r+b") as f:
    f.seek(size // 2)
    chunk = f.read(n)
    f.seek(size // 2)
    f.write(bytes(b ^ 0xFF for b in chunk))


def _truncate(path):
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _one_line(e, *parts):
  msg = str(e.value)
  assert "\n" not in msg, msg
  for p in parts:
    assert str(p) in msg, msg
  return msg


def test_bits_flipped_in_an_actor_data_file_are_refused(tiny, phase, tmp_path):
  _, actor, critic, params, cparams, _, _ = tiny
  ckpt = save_params(tmp_path / "ckpt", actor=params, critic=cparams)
  _flip(_largest_data_file(os.path.join(ckpt, "actor")))
  with pytest.raises(CheckpointError) as e:
    restore_params(ckpt, actor=actor.abstract_params)
  # where the flip lands in a compressed chunk's frame it does not decompress; inside a chunk's payload it
  # decodes to other values, which the digest catches
  assert re.fullmatch(rf"checkpoint {re.escape(ckpt)}: item 'actor' (cannot be read: .*|does not match the "
                      r"digest .*)", _one_line(e))
  # the critic item is untouched and still restores
  got = restore_params(ckpt, critic=critic.abstract_params)["critic"]
  assert params_digest(got) == params_digest(cparams)

  steps = _copy(phase, tmp_path / "rpr1")
  _flip(_largest_data_file(steps / "3" / "actor"))
  with pytest.raises(CheckpointError) as e:
    PhaseCheckpoints(str(steps), keep=5).restore(3, _targets(tiny))
  _one_line(e, f"checkpoint {steps / '3'}: item 'actor' ")
  with pytest.raises(CheckpointError) as e:  # the phase folder: its newest step
    restore_params(steps, actor=actor.abstract_params)
  _one_line(e, f"checkpoint {steps / '3'}: item 'actor' ")


def test_an_item_whose_files_were_replaced_fails_its_digest(tiny, phase, tmp_path):
  """Files that read without error but hold other values (here: step 2's actor under step 3) are found by the
  digest recorded when the step was written."""
  _, actor, _, params, _, _, _ = tiny
  steps = _copy(phase, tmp_path / "rpr1")
  shutil.rmtree(steps / "3" / "actor")
  shutil.copytree(phase / "2" / "actor", steps / "3" / "actor")
  ckpts = PhaseCheckpoints(str(steps), keep=5)
  with pytest.raises(CheckpointError) as e:
    ckpts.restore(3, _targets(tiny))
  with pytest.raises(CheckpointError) as e2:
    restore_params(steps / "3", actor=actor.abstract_params)
  recorded, read = ckpts.read_meta(3)["digests"]["actor"], ckpts.read_meta(2)["digests"]["actor"]
  assert recorded != read == params_digest(jax.tree.map(lambda x: x + 2, params))
  want = (f"checkpoint {steps / '3'}: item 'actor' does not match the digest recorded when it was written "
          f"(recorded {recorded}, read {read}): the files were changed or corrupted")
  assert _one_line(e) == want and _one_line(e2) == want


def test_a_truncated_or_missing_file_is_one_line(tiny, phase, tmp_path):
  _, actor, _, params, _, _, _ = tiny
  ckpt = save_params(tmp_path / "ckpt", actor=params)
  _truncate(_largest_data_file(os.path.join(ckpt, "actor")))
  with pytest.raises(CheckpointError) as e:
    restore_params(ckpt, actor=actor.abstract_params)
  _one_line(e, f"checkpoint {ckpt}: item 'actor' cannot be read: ")

  steps = _copy(phase, tmp_path / "rpr1")
  _truncate(_largest_data_file(steps / "2" / "actor_opt"))
  with pytest.raises(CheckpointError) as e:
    PhaseCheckpoints(str(steps), keep=5).restore(2, _targets(tiny))
  _one_line(e, f"checkpoint {steps / '2'}: item 'actor_opt' cannot be read: ")
  os.remove(steps / "1" / "critic" / "_METADATA")  # the item's tree description
  with pytest.raises(CheckpointError) as e:
    PhaseCheckpoints(str(steps), keep=5).restore(1, _targets(tiny))
  _one_line(e, f"checkpoint {steps / '1'}: item 'critic' cannot be read: ")


def test_a_checkpoint_of_another_model_size_names_the_shape(tiny, phase, tmp_path):
  _, actor, _, params, _, opt, _ = tiny
  ckpt = save_params(tmp_path / "ckpt", actor=params)
  wider = Actor(load_config(None, TINY + MESH + ["model.base_mlp_dim=256"]), actor.mesh)
  with pytest.raises(CheckpointError) as e:
    restore_params(ckpt, actor=wider.abstract_params)
  _one_line(e, f"checkpoint {ckpt}: item 'actor' has another shape than this model: ",
            "decoder.layers.mlp.wi_0.kernel (64, 1, 128) in the checkpoint vs (64, 1, 256) here")
  untied = Actor(load_config(None, TINY + MESH + ["model.logits_via_embedding=false"]), actor.mesh)
  with pytest.raises(CheckpointError) as e:  # a leaf this model has and the checkpoint does not
    restore_params(ckpt, actor=untied.abstract_params)
  _one_line(e, "item 'actor' has other leaves than this model: missing decoder.logits_dense.kernel")
  with pytest.raises(CheckpointError) as e:  # the optimizer state of a phase step, too
    PhaseCheckpoints(str(phase), keep=5).restore(3, {"actor_opt": opt_targets(wider, opt)})
  _one_line(e, "item 'actor_opt' has another shape than this model: 1.0.mu.decoder.layers.mlp.wi_0.kernel")


def test_resume_takes_the_newest_intact_step(tiny, phase, tmp_path):
  _, _, _, params, cparams, _, opt_state = tiny
  steps = _copy(phase, tmp_path / "rpr1")
  _flip(_largest_data_file(steps / "3" / "actor"))
  ckpts = PhaseCheckpoints(str(steps), keep=5)
  step, trees, meta, skipped = ckpts.restore_newest_intact(_targets(tiny))
  assert step == 2 and meta["update"] == 2
  assert [s for s, _ in skipped] == [3] and skipped[0][1].startswith(f"checkpoint {steps / '3'}: item 'actor' ")
  assert set(trees) == {"actor", "critic", "actor_opt"}  # what step 2 holds
  assert params_digest(trees["actor"]) == params_digest(jax.tree.map(lambda x: x + 2, params))
  # the refused step is set aside (kept) and the phase writes it again
  aside = ckpts.set_aside(3)
  assert os.path.isdir(aside) and ckpts.all_steps() == [1, 2]
  ckpts.save(3, TrainState(params, opt_state, cparams, None, 3), {"phase": "rpr1", "seed": 0})
  ckpts.wait()
  assert ckpts.restore_newest_intact(_targets(tiny))[0] == 3
  ckpts.close()

  for s in ("1", "2", "3"):
    _truncate(_largest_data_file(steps / s / "critic"))
  step, trees, meta, skipped = PhaseCheckpoints(str(steps), keep=5).restore_newest_intact(_targets(tiny))
  assert step is None and trees == {} and meta == {}
  assert [s for s, _ in skipped] == [3, 2, 1] and all("item 'critic'" in r for _, r in skipped)
  assert PhaseCheckpoints(str(tmp_path / "empty"), keep=5).restore_newest_intact(_targets(tiny)) == (
      None, {}, {}, [])


def test_an_intact_checkpoint_restores_bitwise_and_an_old_one_with_a_warning(tiny, phase, tmp_path, caplog):
  _, actor, critic, params, cparams, _, opt_state = tiny
  ckpt = save_params(tmp_path / "ckpt", actor=params, critic=cparams)
  out = restore_params(ckpt, actor=actor.abstract_params, critic=critic.abstract_params)
  assert params_digest(out["actor"]) == params_digest(params)
  assert params_digest(out["critic"]) == params_digest(cparams)
  for got, want in zip(jax.tree.leaves(out["actor"]), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  trees, meta = PhaseCheckpoints(str(phase), keep=5).restore(1, _targets(tiny))
  assert {k: params_digest(v) for k, v in trees.items()} == meta["digests"]
  assert meta["digests"]["actor_opt"] == params_digest(opt_state)

  # written before digests were recorded: the trees alone (save_params), a phase meta without "digests"
  old = str(tmp_path / "old")
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
    ckptr.save(old, args=ocp.args.Composite(actor=ocp.args.StandardSave(params)))
  with caplog.at_level(logging.WARNING):
    got = restore_params(old, actor=actor.abstract_params)["actor"]
  assert params_digest(got) == params_digest(params)
  assert f"checkpoint {old}: no digests recorded" in caplog.text
  steps = _copy(phase, tmp_path / "rpr1")
  meta_file = steps / "1" / "meta" / "metadata"
  meta = json.loads(meta_file.read_text())
  del meta["digests"]
  meta_file.write_text(json.dumps(meta))
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    trees, _ = PhaseCheckpoints(str(steps), keep=5).restore(1, _targets(tiny))
  assert params_digest(trees["actor"]) == params_digest(jax.tree.map(lambda x: x + 1, params))
  assert f"checkpoint {steps / '1'}: no digests recorded" in caplog.text


def test_export_of_a_corrupted_checkpoint_exits_2_with_one_line(tiny, tmp_path, capsys):
  from rsi_jax.models.export import main
  cfg, _, _, params, _, _, _ = tiny
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.yml").write_text(dump_config(cfg))
  ckpt = save_params(run / "checkpoints" / "rpr1" / "3", actor=params)
  _flip(_largest_data_file(os.path.join(ckpt, "actor")))
  capsys.readouterr()
  assert main([f"--checkpoint={run / 'checkpoints' / 'rpr1'}", f"--out={tmp_path / 'hf'}"]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"cannot load checkpoint: checkpoint {ckpt}: item 'actor' "), err
  assert err.count("\n") == 1 and "Traceback" not in err
  assert not (tmp_path / "hf").exists()
