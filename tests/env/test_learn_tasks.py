"""The learning check's generated suite (rsi_jax.env.learn_tasks): splits that share no combination, real
Harbor folders the loader reads, and in the sandbox the oracle solves every task of both splits while an agent
that does nothing solves none."""

import json

import pytest

from rsi_jax.env.learn_tasks import BY_NAME, MULTI_STEP_TEMPLATES, TEMPLATES, make_suite, split
from rsi_jax.env.tasks import LAYOUT_HARBOR, load_tasks


def test_splits_share_no_combination_and_cover_every_template():
  parts = split(seed=3, train_per_template=8, heldout_per_template=4)
  train = {(t.name, p) for t, p in parts["train"]}
  held = {(t.name, p) for t, p in parts["heldout"]}
  assert len(train) == 8 * len(TEMPLATES) and len(held) == 4 * len(TEMPLATES) and not train & held
  assert {t for t, _ in held} == {t.name for t in TEMPLATES}  # the one-command families unless named
  # the instruction names every parameter: no held-out instruction occurs in training
  instr = lambda items: {BY_NAME[t].instruction(*p) for t, p in items}  # noqa: E731
  assert not instr(train) & instr(held)
  assert split(seed=3, train_per_template=8, heldout_per_template=4)["heldout"] == parts["heldout"]
  assert split(seed=4, train_per_template=8, heldout_per_template=4)["heldout"] != parts["heldout"]
  with pytest.raises(ValueError, match="fewer than"):
    split(seed=0, train_per_template=100, heldout_per_template=4)


def test_multi_step_tasks_hide_what_the_last_command_needs_and_share_no_instruction_across_splits(tmp_path):
  """A multi-step family's last command needs a value that only a file gives (the instruction and the task's
  name do not), so the reference solution reads it first; two tasks that differ only in that value would share
  an instruction, so a split holds one of them."""
  from rsi_jax.env.learn_tasks import reference_commands, selected, task_name, write_task
  assert selected(["multi-step"]) == MULTI_STEP_TEMPLATES and selected([]) == TEMPLATES
  assert [t.name for t in selected(["find-file", "write-word"])] == ["write-word", "find-file"]
  with pytest.raises(ValueError, match=r"unknown template\(s\) \['nope'\]"):
    selected(["nope"])
  parts = split(seed=3, train_per_template=24, heldout_per_template=24, templates=["multi-step"])
  for name, items in parts.items():
    assert sorted({t.name for t, _ in items}) == sorted(t.name for t in MULTI_STEP_TEMPLATES), name
  instr = {k: {t.instruction(*p) for t, p in v} for k, v in parts.items()}
  assert len(instr["train"]) == len(instr["heldout"]) == 24 * 4 and not instr["train"] & instr["heldout"]
  for t in MULTI_STEP_TEMPLATES:
    assert t.hidden == 1
    for p in t.params()[:: 37]:
      hidden, shown = p[-1], p[:-1]
      steps = t.solution(*p).splitlines()
      assert 2 <= len(steps) <= 3 and hidden in steps[-1] and hidden not in steps[0], (t.name, steps)
      assert hidden not in t.instruction(*p) and all(v in t.instruction(*p) for v in shown), (t.name, p)
      assert hidden not in task_name(t, p).split("-"), task_name(t, p)
  d = write_task(tmp_path, BY_NAME["count-dir"], ("alpha", "beta", "7"))
  assert reference_commands(d) == ["wc -l < /app/data/alpha.txt", "mkdir -p /app/beta/7"]
  assert len((d / "environment" / "data" / "alpha.txt").read_text().splitlines()) == 7
  with pytest.raises(ValueError, match="pointer-copy has 56 instructions, fewer than 40 held-out"):
    split(seed=0, train_per_template=24, heldout_per_template=40, templates=["pointer-copy"])


def test_base_split_is_disjoint_from_train_and_heldout_and_leaves_them_unchanged():
  parts = split(seed=3, train_per_template=24, heldout_per_template=4, base_per_template=24)
  keys = {k: {(t.name, p) for t, p in v} for k, v in parts.items()}
  assert sorted(keys) == ["base", "heldout", "train"]
  assert len(keys["base"]) == 24 * len(TEMPLATES)
  assert not keys["base"] & keys["train"] and not keys["base"] & keys["heldout"]
  without = split(seed=3, train_per_template=24, heldout_per_template=4)
  assert "base" not in without
  assert (without["train"], without["heldout"]) == (parts["train"], parts["heldout"])
  with pytest.raises(ValueError, match=r"fewer than 4 held-out \+ 24 train \+ 29 base"):
    split(seed=0, train_per_template=24, heldout_per_template=4, base_per_template=29)  # 57 > 56 combinations


def test_val_split_is_disjoint_from_the_others_and_leaves_them_unchanged():
  """The validation split (the discovery gate's tasks) comes after every other split's combinations: held-out,
  train and base are the same with it or without it, and it shares no instruction with them."""
  from rsi_jax.env.learn_tasks import MULTI_STEP_TEMPLATES as MULTI_STEP
  names = [t.name for t in MULTI_STEP]
  parts = split(seed=0, train_per_template=24, heldout_per_template=17, templates=names, val_per_template=8)
  keys = {k: {(t.name, p) for t, p in v} for k, v in parts.items()}
  assert sorted(keys) == ["heldout", "train", "val"] and len(keys["val"]) == 8 * len(names)
  assert not keys["val"] & keys["train"] and not keys["val"] & keys["heldout"]
  without = split(seed=0, train_per_template=24, heldout_per_template=17, templates=names)
  assert (without["train"], without["heldout"]) == (parts["train"], parts["heldout"])
  based = split(seed=0, train_per_template=24, heldout_per_template=4, base_per_template=24, val_per_template=4)
  assert based["base"] == split(seed=0, train_per_template=24, heldout_per_template=4, base_per_template=24)["base"]
  with pytest.raises(ValueError, match=r"fewer than 17 held-out \+ 24 train \+ 16 val"):
    split(seed=0, train_per_template=24, heldout_per_template=17, templates=names, val_per_template=16)


def test_suite_folders_load(tmp_path):
  paths = make_suite(tmp_path, seed=1, train_per_template=2, heldout_per_template=1)
  train, held = load_tasks(paths["train"]), load_tasks(paths["heldout"])
  assert len(train) == 2 * len(TEMPLATES) and len(held) == len(TEMPLATES)
  assert all(t.layout == LAYOUT_HARBOR and t.family in BY_NAME for t in train + held)
  meta = json.loads((tmp_path / "suite.json").read_text())
  assert sorted(meta["heldout"]) == sorted(t.name for t in held)
  with pytest.raises(ValueError, match="unknown template"):
    make_suite(tmp_path, templates=["nope"])


def test_failed_attempts_are_told_apart_by_their_first_action_off_the_reference(tmp_path):
  """The learning check's failure modes: a failed attempt's first action that departs from its task's reference
  commands (read from the generated solve.sh), in order."""
  from rsi_jax.env.learn_tasks import failure_mode, failure_modes, reference_commands, write_task
  d = write_task(tmp_path, BY_NAME["make-dir"], ("beta", "gamma"))
  assert reference_commands(d) == ["mkdir -p /app/beta/gamma"]
  ref = ["mkdir -p /app/beta/gamma"]
  assert failure_mode(["mkdir -p /app/gamma/beta\n"], ref) == "wrong arguments"
  assert failure_mode(["wc -l < /app/beta.txt"], ref) == "other command"
  assert failure_mode(['<malformed: no JSON object found> mk'], ref) == "malformed"
  assert failure_mode(["<done>"], ref) == "no command" and failure_mode([], ref) == "no command"
  assert failure_mode(["mkdir  -p /app/beta/gamma", "rm -r /app/beta"], ref) == "wrong arguments"  # judged by its step
  # multi-step: the step where the attempt leaves the reference decides, not its first action
  two = ["grep -l apple /app/data/*.txt", "echo gamma.txt > /app/beta.txt"]
  assert failure_mode([two[0], "echo delta.txt > /app/beta.txt"], two) == "wrong arguments"
  assert failure_mode([two[0], "cp /app/data/gamma.txt /app/beta.txt"], two) == "other command"
  assert failure_mode([two[0], "<done>"], two) == "no command" and failure_mode([two[0]], two) == "no command"
  assert failure_mode([two[0], "<malformed: x> y"], two) == "malformed"
  assert failure_mode(["cat /app/data/alpha.txt", *two], two) == "other command"  # an extra first step
  rec = lambda actions, success=0, infra=False: {"task": d.name, "success": success, "infra_failure": infra,  # noqa: E731
                                                 "actions": actions}
  records = [rec(["mkdir -p /app/beta/gamma"], success=1), rec(["mkdir /app/x"]), rec(["mkdir /app/y"]),
             rec(["echo hi"]), rec([], infra=True), rec(["<malformed: x> y"])]
  assert failure_modes(records, tmp_path) == {"wrong arguments": 2, "other command": 1, "malformed": 1,
                                              "no command": 0}


@pytest.mark.docker
@pytest.mark.slow
def test_oracle_solves_both_splits_and_doing_nothing_solves_none(tmp_path, docker_client, settings, tokenizer,
                                                                  renderer):
  from rsi_jax.env.harness import JsonHarness, OracleHarness, ScriptedPolicy
  from rsi_jax.env.pool import EnvPool
  from rsi_jax.policy import SamplingParams
  paths = make_suite(tmp_path, seed=0, train_per_template=2, heldout_per_template=2,
                     templates=["one-command", "multi-step"])
  tasks = load_tasks(paths["train"]) + load_tasks(paths["heldout"])
  assert len(tasks) == 4 * (len(TEMPLATES) + len(MULTI_STEP_TEMPLATES))
  nothing = lambda: JsonHarness(ScriptedPolicy(tokenizer, ['{"done": true}']), renderer,  # noqa: E731
                                SamplingParams(), max_turns=1)
  with EnvPool(settings, concurrency=4) as pool:
    oracle = pool.run([(t, OracleHarness()) for t in tasks])
    idle = pool.run([(t, nothing) for t in tasks])
  assert [(r.task, r.outcome.reason) for r in oracle if r.success != 1] == []
  assert [r.task for r in idle if r.success != 0 or r.infra_failure] == []


def test_learn_check_table_prints_the_stages_and_their_failure_modes(tmp_path):
  """scripts/learn_check_table.py on a run folder with two evaluated stages: the table, the failure modes
  from the attempts' actions against the run's evaluation suite, and learn_check.json."""
  import subprocess
  import sys

  import yaml

  from rsi_jax.config import REPO_ROOT
  from rsi_jax.env.learn_tasks import write_task
  suite = tmp_path / "heldout"
  d = write_task(suite, BY_NAME["write-word"], ("alpha", "lemon"))
  run = tmp_path / "run"
  (run / "eval").mkdir(parents=True)
  (run / "config.yml").write_text(yaml.safe_dump({"eval": {"tasks_dir": str(suite)}}))
  (run / "lineage.json").write_text(json.dumps([{"phase": "rsr0"}]))
  for phase, step, actions, ok in (("base", 0, ["<malformed: no JSON object found> x"], 0),
                                   ("rsr0", 120, ["echo tomato > /app/alpha.txt"], 0),
                                   ("rsr0", 120, ["echo lemon > /app/alpha.txt"], 1)):
    out = run / "eval" / phase / str(step)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "attempts.jsonl", "a") as f:
      f.write(json.dumps({"task": d.name, "success": ok, "infra_failure": False, "actions": actions}) + "\n")
    n = len((out / "attempts.jsonl").read_text().splitlines())
    wins = sum(json.loads(x)["success"] for x in (out / "attempts.jsonl").read_text().splitlines())
    (out / "summary.json").write_text(json.dumps({"mean_at_r": 100.0 * wins / n, "pass_at_r": 100.0 * (wins > 0),
                                                  "runs": n, "n_tasks": 1, "infra_failures": 0}))
  p = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "learn_check_table.py"), str(run),
                      "--wall-seconds", "90"], capture_output=True, text=True, timeout=120)
  assert p.returncode == 0, p.stderr
  lines = p.stdout.splitlines()
  assert lines[0] == f"held-out strict success (1 tasks x 1) -- {run}"
  assert lines[2].split() == ["init", "(random)", "0.0", "0.0", "0"]
  assert lines[3].split() == ["Base", "(SFT", "warm", "start)", "50.0", "100.0", "0"]
  assert "wall time 1.5 min" in p.stdout
  modes = {ln.split("  ")[0].strip(): [int(x) for x in ln.split()[-4:]] for ln in lines if ln.startswith(("init", "Base"))
           and len(ln.split()) >= 4 and "." not in ln}
  assert modes == {"init (random)": [0, 0, 1, 0], "Base (SFT warm start)": [1, 0, 0, 0]}
  saved = json.loads((run / "learn_check.json").read_text())
  assert [s["failures"]["wrong arguments"] for s in saved["stages"]] == [0, 1] and saved["wall_seconds"] == 90
