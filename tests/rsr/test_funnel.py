"""The RSR funnel end to end on shipped tasks with real containers and the scripted test double; the
projection 𝒫; Q_clean as a grain source."""

import dataclasses
import json

import numpy as np
import pytest

from rsi_jax.config import CONFIG_DIR, REPO_ROOT, ConfigError, load_config
from rsi_jax.env import EnvPool, make_harness
from rsi_jax.env.tasks import load_tasks
from rsi_jax.policy import SamplingParams
from rsi_jax.rsr.funnel import STAGES, QClean, funnel_table, project, run_funnel
from rsi_jax.rsr.runbook import load_template
from rsi_jax.rsr.scripted import GUIDANCE_MARK, LABEL, ScriptedRSRPolicy

NAMES = ["file-ops-backup-archive", "text-processing-config-edit", "shell-scripting-retry"]


# ------------------------------------------------------------------------------------------- Q_clean


def test_qclean_keeps_multiplicities_and_resumes_from_iterator_state():
  records = [{"task": t} for t in "aaabbc"]  # task a accepted three times, b twice, c once
  q = QClean(records)
  ds = q.batches(seed=7, epochs=3, batch_size=4)
  assert len(ds) == -(-6 * 3 // 4)
  seen = [int(i) for b in ds for i in b]
  assert len(seen) == 18
  for e in range(3):  # every pass is a permutation: each accepted item once, multiplicities of tasks kept
    assert sorted(seen[6 * e:6 * e + 6]) == list(range(6))
  tasks = [records[i]["task"] for i in seen]
  assert (tasks.count("a"), tasks.count("b"), tasks.count("c")) == (9, 6, 3)
  assert seen != [i for b in q.batches(seed=8, epochs=3, batch_size=4) for i in b]  # the seed matters
  assert seen == [i for b in q.batches(seed=7, epochs=3, batch_size=4) for i in b]  # and fixes the order
  it = iter(ds.to_iter_dataset())
  first = [next(it).tolist() for _ in range(2)]
  state = json.loads(json.dumps(it.get_state()))  # what a checkpoint's meta stores
  rest = [b.tolist() for b in it]
  resumed = iter(q.batches(seed=7, epochs=3, batch_size=4).to_iter_dataset())
  resumed.set_state(state)
  assert [b.tolist() for b in resumed] == rest
  assert [i for b in first + rest for i in b] == seen


# ------------------------------------------------------------------------------------------ with Docker


class LeakyScriptedPolicy(ScriptedRSRPolicy):
  """Test double on top of the test double: for one task its runbooks name the verifier's folder (the review
  gate must reject them), for another its guided executions also list /tests (the screen must reject
  them although the verifier passes)."""

  def __init__(self, tokenizer, tasks, leaky_plan: str, leaky_exec: str):
    super().__init__(tokenizer, tasks)
    self.leaky_plan, self.leaky_exec = leaky_plan, leaky_exec

  def reply(self, prompt):
    text = super().reply(prompt)
    if "You write runbooks" in prompt and self._task(prompt).name == self.leaky_plan:
      text += "- `ls /tests` shows the checks.\n"
    if GUIDANCE_MARK in prompt and '"command"' in text and self._task(prompt).name == self.leaky_exec:
      obj = json.loads(text)
      obj["command"] += "\nls /tests 2>/dev/null || true"
      text = json.dumps(obj)
    return text


@pytest.fixture(scope="module")
def pool(docker_client, settings):
  p = EnvPool(settings, concurrency=2, reap=False)
  yield p
  p.close()


@pytest.fixture(scope="module")
def tasks():
  return [t for t in load_tasks(REPO_ROOT / "tasks") if t.name in NAMES]


@pytest.mark.docker
@pytest.mark.slow
def test_funnel_end_to_end_counts_what_happened(pool, tasks, tokenizer, renderer, tmp_path):
  cfg = load_config(CONFIG_DIR / "smoke.yml", ["rsr.num_runbooks=2", "rsr.num_repeats=2"])
  policy = LeakyScriptedPolicy(tokenizer, tasks, leaky_plan=NAMES[1], leaky_exec=NAMES[2])
  res = run_funnel(cfg, tasks, pool, renderer, lambda tag: policy, label=LABEL, workdir=str(tmp_path))
  m = res.manifest
  st = m["stages"]
  # 3 tasks x 2 harnesses; K = 2 runbooks each; NAMES[1]'s runbooks leak; M = 2 executions of the others,
  # NAMES[2]'s executions read /tests
  assert st["attempted"] == 6 and st["discovered"] == 6 and st["planned"] == 12
  assert st["reviewed"] == 8 and st["rejected"]["leakage:verifier_path"] == 4 and st["review_rejected"] == 4
  assert st["reviewed"] + st["review_rejected"] == st["planned"]
  assert st["executed"] == 16 and st["verified"] == 16
  assert st["leak_screened"] == 8 and st["rejected"]["screen:leakage:verifier_path"] == 8
  assert st["accepted"] == 8 == len(res.episodes) == len(res.records)
  assert st["infra_failures"] == {}
  assert {r["task"] for r in res.records} == {NAMES[0]}
  for h in ("json", "xml"):  # per discovery harness: half of everything
    assert m["by_harness"][h]["accepted"] == 4 and m["by_harness"][h]["attempted"] == 3
  assert sum(f["attempted"] for f in m["by_family"].values()) == 6
  assert m["policy"] == LABEL and m["templates"]["plan"]["version"] == "1"
  # the files agree with the manifest
  runbooks = [json.loads(x) for x in (tmp_path / "runbooks.jsonl").read_text().splitlines()]
  execs = [json.loads(x) for x in (tmp_path / "executions.jsonl").read_text().splitlines()]
  assert len(runbooks) == 12 and sum(r["accepted"] for r in runbooks) == 8
  assert len(execs) == 16 and sum(e["success"] == 1 and not e["leakage"] for e in execs) == 8
  assert json.loads((tmp_path / "rsr_manifest.json").read_text()) == json.loads(json.dumps(m))
  table = funnel_table(m)
  assert all(s in table for s in STAGES) and "rejected leakage:verifier_path" in table
  # projection: every stored sample starts with the public prompt, no runbook text in any token
  for eps in res.episodes:
    for s in eps:
      text = tokenizer.decode(s.ids.tolist())
      assert GUIDANCE_MARK not in text and "## Steps" not in text and "## Goal" not in text
      assert not s.gen_mask[:50].any() and s.gen_mask.sum() > 0


@pytest.mark.docker
@pytest.mark.slow
def test_plan_demonstrations_keep_each_accepted_runbook_and_its_guided_run_as_samples(pool, tasks, tokenizer,
                                                                                     renderer, tmp_path):
  """rsr.plan_demonstrations (a warm start with the scripted planner): each runbook that passed review is also an
  SFT sample -- the planning prompt, then exactly the runbook's text and <|im_end|> as the generated tokens --
  and so is each accepted execution as it ran under that runbook's guidance, after the accepted (projected)
  trajectories, which are unchanged; a leaking runbook (rejected) is neither."""
  cfg = load_config(CONFIG_DIR / "smoke.yml", ["rsr.num_runbooks=1", "rsr.num_repeats=1", "rsr.harnesses=[json]",
                                               "rsr.plan_demonstrations=true"])
  policy = LeakyScriptedPolicy(tokenizer, tasks, leaky_plan=NAMES[1], leaky_exec="")
  res = run_funnel(cfg, tasks, pool, renderer, lambda tag: policy, label=LABEL, workdir=str(tmp_path))
  st, m = res.manifest["stages"], res.manifest
  assert st["reviewed"] == 2 and st["accepted"] == 2 and m["plan_demonstrations"] == 2
  assert m["guided_demonstrations"] == 2
  assert len(res.episodes) == len(res.records) == 6
  assert [r.get("kind") for r in res.records] == [None, None, "planning", "planning", "guided", "guided"]
  runbooks = [json.loads(x) for x in (tmp_path / "runbooks.jsonl").read_text().splitlines()]
  # each guided demonstration is its accepted execution as it ran: the same generated tokens as the projected
  # trajectory, the prompt with the private guidance (the runbook) that the projection took out
  for rec, eps in zip(res.records[4:], res.episodes[4:]):
    (proj,) = [e for e, r in zip(res.episodes[:2], res.records[:2]) if r["episode_id"] == rec["episode_id"]]
    assert len(eps) == len(proj) and all(s.episode == res.records.index(rec) for s in eps)
    for g, p in zip(eps, proj):
      assert g.ids[g.gen_mask].tolist() == p.ids[p.gen_mask].tolist()
    first = tokenizer.decode(eps[0].ids[~eps[0].gen_mask].tolist())
    rb = runbooks[rec["runbook"]]["runbook"]
    assert "Private guidance" in first and rb.strip().splitlines()[0] in first
    assert "Private guidance" not in tokenizer.decode(proj[0].ids[~proj[0].gen_mask].tolist())
  for rec, eps in zip(res.records[2:4], res.episodes[2:4]):
    (sample,) = eps
    assert sample.episode == res.records.index(rec)
    rb = runbooks[rec["runbook"]]
    assert rb["accepted"] and rb["task"] == rec["task"] != NAMES[1]
    gen = sample.ids[sample.gen_mask]
    assert gen.tolist() == tokenizer.encode_text(rb["runbook"]) + [tokenizer.im_end_id]
    prompt = tokenizer.decode(sample.ids[~sample.gen_mask].tolist())
    assert "You write runbooks" in prompt and prompt.endswith(tokenizer.decode(renderer.generation_prompt()))
    assert not sample.gen_mask[:len(sample.ids) - len(gen)].any()
  assert [json.loads(x).get("kind") for x in (tmp_path / "q_clean.jsonl").read_text().splitlines()][2:] == \
      ["planning", "planning", "guided", "guided"]


class FailingExecutionPolicy(ScriptedRSRPolicy):
  """The scripted test double, except that under a runbook's guidance it answers ``failing``'s task with a
  command that does nothing, so that execution fails its verifier."""

  def __init__(self, tokenizer, tasks, failing: str):
    super().__init__(tokenizer, tasks)
    self.failing = failing

  def reply(self, prompt):
    text = super().reply(prompt)
    if GUIDANCE_MARK in prompt and '"command"' in text and self._task(prompt).name == self.failing:
      text = json.dumps({"command": "true", "done": False})
    return text


@pytest.mark.docker
@pytest.mark.slow
def test_the_broken_rsr_variant_trains_on_the_rejected_executions_only(pool, tasks, tokenizer, renderer,
                                                                       tmp_path, monkeypatch):
  """scripts/learn_check_rewrite.py --broken: with the gate into Q_clean inverted, the one execution the verifier
  rejected is Q_clean (its projected trajectory: the public prompt, the command that did nothing), and the two
  that verified are not."""
  import sys
  sys.path.insert(0, str(REPO_ROOT / "scripts"))
  import learn_check_rewrite

  from rsi_jax.rsr import funnel
  monkeypatch.setattr(funnel, "execution_verified", learn_check_rewrite.rejected_only)
  cfg = load_config(CONFIG_DIR / "smoke.yml", ["rsr.num_runbooks=1", "rsr.num_repeats=1", "rsr.harnesses=[json]"])
  policy = FailingExecutionPolicy(tokenizer, tasks, failing=NAMES[2])
  res = run_funnel(cfg, tasks, pool, renderer, lambda tag: policy, label=LABEL, workdir=str(tmp_path))
  st = res.manifest["stages"]
  assert st["discovered"] == st["reviewed"] == st["executed"] == 3 and st["infra_failures"] == {}
  assert st["accepted"] == 1 and [r["task"] for r in res.records] == [NAMES[2]]
  execs = [json.loads(x) for x in (tmp_path / "executions.jsonl").read_text().splitlines()]
  assert sorted((e["task"], e["success"]) for e in execs) == sorted([(NAMES[0], 1), (NAMES[1], 1), (NAMES[2], 0)])
  (eps,) = res.episodes
  gen = tokenizer.decode(eps[0].ids[eps[0].gen_mask.astype(bool)].tolist())
  assert gen.startswith('{"command": "true"') and GUIDANCE_MARK not in tokenizer.decode(eps[0].ids.tolist())


def test_plan_demonstrations_need_the_scripted_planner():
  with pytest.raises(ConfigError, match="rsr.plan_demonstrations: needs policy scripted"):
    load_config(CONFIG_DIR / "smoke.yml", ["rsr.plan_demonstrations=true", "rsr.policy=actor"])
  with pytest.raises(ConfigError, match="num_runbooks 0"):
    load_config(CONFIG_DIR / "smoke.yml", ["rsr.plan_demonstrations=true", "rsr.num_runbooks=0"])


@pytest.mark.docker
@pytest.mark.slow
def test_runbook_stage_off_is_verified_self_imitation(pool, tasks, tokenizer, renderer, tmp_path):
  """rsr.num_runbooks 0: no planning, review or fresh execution; the verified discovery episodes that pass
  the leakage screen are Q_clean as generated (their ids and masks), and the manifest says so."""
  cfg = load_config(CONFIG_DIR / "smoke.yml", ["rsr.num_runbooks=0", "rsr.harnesses=[json]"])
  policy = LeakyScriptedPolicy(tokenizer, tasks, leaky_plan="", leaky_exec="")
  res = run_funnel(cfg, tasks, pool, renderer, lambda tag: policy, label=LABEL, workdir=str(tmp_path))
  st = res.manifest["stages"]
  assert st["attempted"] == st["discovered"] == st["leak_screened"] == st["accepted"] == len(tasks) == 3
  assert st["planned"] == st["executed"] == 0 and res.manifest["settings"]["num_runbooks"] == 0
  assert res.manifest["policy"] == f"{LABEL}, runbook stage off (verified self-imitation)"
  assert [r["runbook"] for r in res.records] == [None] * 3 and not (tmp_path / "runbooks.jsonl").read_text()
  for eps in res.episodes:  # the public prompt, then the reference command the scripted policy gave
    (s,) = eps
    text = tokenizer.decode(s.ids[s.gen_mask.astype(bool)].tolist())
    assert text.startswith('{"command": ') and GUIDANCE_MARK not in tokenizer.decode(s.ids.tolist())
    assert not s.gen_mask[:50].any()


@pytest.mark.docker
def test_projection_keeps_sampled_ids_and_masks_exactly(pool, tasks, tokenizer, renderer):
  """A guided execution with a summary (two segments): 𝒫 swaps each segment's private prompt for the public
  one and leaves every sampled id, mask entry, logprob and observation after it as it was."""
  cfg = load_config(CONFIG_DIR / "smoke.yml")
  task = next(t for t in tasks if t.name == NAMES[0])
  policy = ScriptedRSRPolicy(tokenizer, tasks)
  marker = "RUNBOOK-ONLY-MARKER-7f3a"
  runbook = (f"## Goal\nBack up the project ({marker}).\n\n## Steps\n1. Archive:\n```bash\ncd /app && tar "
             f"--exclude='*.tmp' --exclude='__pycache__' -czf backup.tar.gz project\n```\n\n## Checks\n- `ls /app`\n")
  exec_t = load_template(cfg.rsr.exec_template)
  guide = lambda t: exec_t.render(instruction=t.instruction.strip(), runbook=runbook)  # noqa: E731
  probe = make_harness("json", policy, renderer, SamplingParams(), env_cfg=cfg.env, guidance=guide)
  env = dataclasses.replace(cfg.env, summarize_threshold_tokens=len(probe.initial_prompt(task)) + 40, max_turns=4)
  h = make_harness("json", policy, renderer, SamplingParams(), env_cfg=env, guidance=guide)
  (res,) = pool.run([(task, h)])
  assert res.success == 1 and len(res.segments) >= 2, res.summary()
  public = [h.initial_prompt(task, summary=None, private=False)]
  public += [h.initial_prompt(task, summary=t.text, private=False) for t in res.turns if t.kind == "summary"]
  projected = project(res, h, task)
  assert len(projected) == len(res.segments)
  for raw, new, pub in zip(res.segments, projected, public):
    n = len(next(t for t in res.turns if t.segment == raw.index).prompt_ids)
    k = len(pub)
    assert new.ids[:k].tolist() == pub
    for f in ("ids", "gen_mask", "logprobs", "turn_ids", "weight_versions"):
      assert np.array_equal(getattr(new, f)[k:], getattr(raw, f)[n:]), f
    assert not new.gen_mask[:k].any() and (new.turn_ids[:k] == -1).all()
    assert marker in tokenizer.decode(raw.ids.tolist())
    assert marker not in tokenizer.decode(new.ids.tolist()) and GUIDANCE_MARK not in tokenizer.decode(new.ids)
  # the public prompt is exactly what the target harness shows a fresh agent
  plain = make_harness("json", policy, renderer, SamplingParams(), env_cfg=env)
  assert public[0] == plain.initial_prompt(task)




class _StopAfterRecords:
  """A stop notice (what the driver's SIGTERM handler sets) given once the funnel has recorded ``n`` units of
  ``stage``."""
  signal_name = "SIGTERM"

  def __init__(self, workdir, stage: str, n: int):
    self.dir, self.n = workdir / "progress" / stage, n

  @property
  def requested(self) -> bool:
    return self.dir.exists() and len(list(self.dir.glob("*.json.gz"))) >= self.n


@pytest.mark.docker
@pytest.mark.slow
def test_interrupted_funnel_continues_from_its_records_and_ends_the_same(pool, tasks, tokenizer, renderer,
                                                                          tmp_path):
  """A stop notice during discovery, then again during execution: each attempt raises StopRequested with its
  running episodes aborted (not recorded); the next continues from the records (the recorded units are not run
  again) and the last ends with the stages, records and Q_clean (ids, masks, logprobs) of an uninterrupted
  funnel."""
  from rsi_jax.env.records import episode_from_json, episode_to_json
  from rsi_jax.stop import StopRequested
  cfg = load_config(CONFIG_DIR / "smoke.yml", ["rsr.num_runbooks=2", "rsr.num_repeats=2", "rsr.harnesses=[json]"])
  policy = LeakyScriptedPolicy(tokenizer, tasks, leaky_plan=NAMES[1], leaky_exec="")
  whole = run_funnel(cfg, tasks, pool, renderer, lambda tag: policy, label=LABEL, workdir=str(tmp_path / "a"))
  b = tmp_path / "b"
  ran, stopped = [], []
  for stop in (_StopAfterRecords(b, "discovery", 1), _StopAfterRecords(b, "execution", 1), None):
    before = pool.counts["episodes"]
    try:
      got = run_funnel(cfg, tasks, pool, renderer, lambda tag: policy, label=LABEL, workdir=str(b), stop=stop)
      stopped.append(False)
    except StopRequested as e:
      assert str(e) == "SIGTERM" and not (b / "rsr_manifest.json").exists()
      stopped.append(True)
    ran.append(pool.counts["episodes"] - before)
  assert stopped == [True, True, False]
  restored = got.manifest["progress"]["restored"]
  st = whole.manifest["stages"]
  assert restored["discovery"] == st["attempted"] == 3 and restored["planning"] == st["planned"] == 6
  assert 1 <= restored["execution"] < st["executed"]
  # the last attempt ran only the executions not recorded; nothing recorded was run again
  assert ran[2] == st["executed"] - restored["execution"]
  assert got.manifest["stages"] == st and got.manifest["progress"]["record_seconds"] > 0
  strip = lambda recs: [{k: v for k, v in r.items() if k != "episode_id"} for r in recs]  # noqa: E731
  assert strip(got.records) == strip(whole.records) and len(got.records) == st["accepted"] > 0
  for ea, eb in zip(whole.episodes, got.episodes):
    for sa, sb in zip(ea, eb):
      for f in ("ids", "gen_mask", "logprobs", "turn_ids", "weight_versions"):
        assert np.array_equal(getattr(sa, f), getattr(sb, f)), f
  # a record is the episode exactly
  rec = json.loads(__import__("gzip").decompress((b / "progress" / "discovery" / "0.json.gz").read_bytes()))
  res = episode_from_json(rec)
  assert episode_to_json(res) == rec and res.success == 1 and res.turns and res.segments
  assert res.segments[0].logprobs.dtype == np.float32 and res.turns[0].prompt_ids.dtype == np.int32
