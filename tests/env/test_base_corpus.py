"""The stand-in Base's corpus (rsi_jax.env.base_corpus): every command is copyable from its instruction, no value is
the learning check's, the unseen values never occur in the corpus, and the broken variant keeps the programs
but not the values."""

import json
import random
import re

import pytest

from rsi_jax.env import base_corpus as bc
from rsi_jax.env import learn_tasks


@pytest.fixture(scope="module")
def pools(tokenizer):
  return bc.value_pools(tokenizer)


def test_every_command_value_is_in_every_phrasing_of_its_instruction():
  assert len(bc.SHAPES) >= 30 and len({s.name for s in bc.SHAPES}) == len(bc.SHAPES)
  assert len({s.command.split()[0] for s in bc.SHAPES}) >= 20  # many programs
  for s in bc.SHAPES:
    assert s.slots and len(s.phrasings) >= 2, s.name
    for p in s.phrasings:
      assert set(re.findall(r"\{(\w)\}", p)) == set(s.slots), (s.name, p)


def test_a_variant_moves_the_same_path_and_extension_in_the_instruction_and_the_command(pools):
  """Every phrasing can take each variant (its command's first path /app/{a} and its extensions are the
  phrasing's too), and over many draws a shape appears at the top level and a folder deeper, with its own
  extension and others, each change the same in the instruction and the command."""
  seen, _ = pools
  for s in bc.SHAPES:
    assert len(s.phrasings) >= 3, s.name  # sentence frames, not one sentence
    for p in s.phrasings:
      assert ("/app/{a}" in s.command) <= ("/app/{a}" in p), (s.name, p)
      assert set(bc.EXTENSION.findall(p)) == set(bc.EXTENSION.findall(s.command)), (s.name, p)
  rng = random.Random(0)
  draws = [bc.variant(bc.SHAPES[3], rng) for _ in range(200)]  # cp: /app/{a}.csv -> /app/{b}.csv
  assert {c for _, c in draws} == {"cp /app/{a}.csv /app/{b}.csv", "cp /app/{d}/{a}.csv /app/{b}.csv",
                                   "cp /app/{a}.{e} /app/{b}.{e}", "cp /app/{d}/{a}.{e} /app/{b}.{e}"}
  for instruction, command in draws:
    assert ("{d}" in instruction) == ("{d}" in command) and ("{e}" in instruction) == ("{e}" in command)
  ps = bc.pairs(40 * len(bc.SHAPES), 0, seen)
  nested = [i for i, c in ps if re.search(rf"/app/({'|'.join(bc.DIRS)})/", c)]
  assert 0.2 < len(nested) / len(ps) < 0.6
  for instruction, command in ps:  # the folder and the extensions the command uses are the instruction's
    for x in re.findall(rf"/app/({'|'.join(bc.DIRS)})/", command) + bc.EXTENSION.findall(command):
      assert x in instruction, (instruction, command)
  assert not set(bc.DIRS) & set(seen)  # a folder of DIRS is never a value


def test_value_pools_are_large_disjoint_and_hold_none_of_the_check_values(pools):
  seen, unseen = pools
  assert len(seen) > 10_000 and len(unseen) > 1_000 and not set(seen) & set(unseen)
  check = set(learn_tasks.NAMES) | set(learn_tasks.WORDS) | set(learn_tasks.LOG_WORDS)
  assert not (set(seen) | set(unseen)) & check
  assert all(re.fullmatch(r"[a-z]{4,9}", w) for w in seen + unseen)
  with pytest.raises(ValueError, match="shared with the learning check's tasks: \\['alpha'\\]"):
    bc.pairs(4, 0, seen[:10] + ("alpha",))


def test_pairs_are_seeded_cover_every_shape_and_copy_the_instruction(pools):
  seen, unseen = pools
  ps = bc.pairs(2 * len(bc.SHAPES), 0, seen)
  assert ps == bc.pairs(2 * len(bc.SHAPES), 0, seen) != bc.pairs(2 * len(bc.SHAPES), 1, seen)
  assert {s.name for s in bc.SHAPES} == {bc.SHAPES[k % len(bc.SHAPES)].name for k in range(len(ps))}
  words = set(seen)
  for instruction, command in ps:
    used = [w for w in re.findall(r"[a-z]+", command) if w in words]
    assert used and all(w in instruction for w in used), (instruction, command)
  assert not {w for _, c in ps for w in re.findall(r"[a-z]+", c)} & set(unseen)
  assert bc.reply("ls /app/x") == '{"command": "ls /app/x", "done": false}'
  # a subset of shapes: those only, in turn
  two = (bc.SHAPES[3], bc.SHAPES[0])
  sub = bc.pairs(6, 0, seen, shapes=two)
  programs = [c.split()[0] for _, c in sub]
  assert programs == [two[k % 2].command.split()[0] for k in range(6)] and programs[:2] == ["cp", "echo"]
  with pytest.raises(ValueError, match="at least one shape"):
    bc.pairs(1, 0, seen, shapes=())


def test_runbook_tasks_are_seeded_a_stream_of_their_own_and_copy_the_instruction(pools):
  """rsr.corpus_runbooks' tasks: the shapes in turn (with procedures, every other task a procedure in turn), the
  same for a seed and not the pairs' or the procedures' draws; a shape's one command copies the instruction's
  values, a procedure's commands are its read and act with the output the read prints."""
  seen, _ = pools
  n = 2 * len(bc.SHAPES)
  ts = bc.runbook_tasks(n, 0, seen)
  assert ts == bc.runbook_tasks(n, 0, seen) != bc.runbook_tasks(n, 1, seen)
  assert [name for name, *_ in ts] == [bc.SHAPES[k % len(bc.SHAPES)].name for k in range(n)]
  assert [(i, c) for _, i, _, (c,) in ts] != bc.pairs(n, 0, seen)  # not the pairs' stream
  words = set(seen)
  for name, instruction, outputs, commands in ts:
    used = [w for w in re.findall(r"[a-z]+", commands[0]) if w in words]
    assert outputs == {} and len(commands) == 1 and used and all(w in instruction for w in used), (name, commands)
  mixed = bc.runbook_tasks(4 * len(bc.PROCEDURES), 0, seen, procedures=True)
  assert [name for name, *_ in mixed[1::2]] == [bc.PROCEDURES[k % len(bc.PROCEDURES)].name
                                                for k in range(2 * len(bc.PROCEDURES))]
  assert [name for name, *_ in mixed[::2]] == [bc.SHAPES[k].name for k in range(2 * len(bc.PROCEDURES))]
  procs = {p.name: p for p in bc.PROCEDURES}
  for name, instruction, outputs, (read, act) in mixed[1::2]:
    assert set(outputs) == {read} and read.split()[0] == procs[name].read.split()[0], (name, read)
    assert all(w in instruction for w in re.findall(r"[a-z]+", read) if w in words), (name, read)
    assert all(w in instruction + outputs[read] for w in re.findall(r"[a-z]+", act) if w in words), (name, act)
    needs = [w for w in re.findall(r"[a-z]+|[0-9]+", act) if (w in words or w.isdigit()) and w not in instruction]
    assert needs and all(w in outputs[read] for w in needs), (name, act)  # needs the read (a name or a count)
  with pytest.raises(ValueError, match="shared with the learning check's tasks"):
    bc.runbook_tasks(2, 0, seen[:10] + ("alpha",))


def test_the_broken_variant_keeps_instructions_and_programs_but_not_the_values(pools):
  seen, _ = pools
  good, broken = bc.pairs(200, 0, seen), bc.pairs(200, 0, seen, broken=True)
  assert [i for i, _ in good] == [i for i, _ in broken]
  assert [c.split()[0] for _, c in good] == [c.split()[0] for _, c in broken]
  words = set(seen)
  copied = sum(all(w in i for w in re.findall(r"[a-z]+", c) if w in words) for i, c in broken)
  assert copied <= 2, copied  # a value drawn afresh is (almost) never the instruction's


def _value_tokens(tokenizer, text: str, value: str) -> set[tuple[int, ...]]:
  """The token ids covering each occurrence of ``value`` in ``text`` (as whole word: not inside another)."""
  spans, n = [], 0  # (token id, first character, end)
  for t in tokenizer.encode(text):
    spans.append((t, n, n + len(tokenizer.decode([t]))))
    n = spans[-1][2]
  assert n == len(text), "the corpus is ASCII: a token's text is its share of the characters"
  return {tuple(t for t, s, e in spans if s < m.end() and e > m.start())
          for m in re.finditer(rf"(?<![a-z]){value}(?![a-z])", text)}


def test_a_value_is_the_same_tokens_in_the_command_as_in_its_instruction(tokenizer, pools):
  """Copying an unseen value is copying its tokens: a value that the tokenizer splits one way in the instruction
  (`` farm``, after a space) and another in the command (``/farm``, ``'farm``) cannot be copied by a model that
  never saw the value, only spelled. So every value keeps its neighbour (space, ``/``, ...) in both."""
  _, unseen = pools
  for k, (instruction, command) in enumerate(bc.pairs(8 * len(bc.SHAPES), 3, unseen)):
    shape = bc.SHAPES[k % len(bc.SHAPES)]
    reply = bc.reply(command)
    for v in {w for w in re.findall(r"[a-z]+", command) if w in set(unseen)}:
      said, done = _value_tokens(tokenizer, instruction, v), _value_tokens(tokenizer, reply, v)
      assert done and done <= said, (shape.name, instruction, command, v, said, done)


def _harness(tokenizer, max_turns: int):
  from rsi_jax.config import CONFIG_DIR, load_config
  from rsi_jax.env.harness import ScriptedPolicy, make_harness
  from rsi_jax.models import ChatRenderer
  env = load_config(CONFIG_DIR / "learn_check.yml", [f"env.max_turns={max_turns}"]).env
  return make_harness("json", ScriptedPolicy(tokenizer, []), ChatRenderer(tokenizer), env_cfg=env)


def test_a_procedure_reads_a_value_the_instruction_does_not_give_and_acts_on_it(tokenizer, pools):
  """Each procedure episode, recorded by the json harness's own loop: the first command's values are the
  instruction's, the value the second command needs is only in the first one's output, and it is the same tokens
  there as in the command (copyable when unseen); the episode ends with done."""
  from rsi_jax.env.actions import parse_json_action
  _, unseen = pools
  assert len(bc.PROCEDURES) >= 5 and len({p.name for p in bc.PROCEDURES}) == len(bc.PROCEDURES)
  ps = bc.procedures(4 * len(bc.PROCEDURES), 3, unseen)
  assert ps == bc.procedures(4 * len(bc.PROCEDURES), 3, unseen) != bc.procedures(4 * len(bc.PROCEDURES), 4, unseen)
  for k, (instruction, outputs, commands) in enumerate(ps):
    proc = bc.PROCEDURES[k % len(bc.PROCEDURES)]
    run = bc.procedure_episode(_harness(tokenizer, 4), tokenizer, instruction, outputs, commands)
    assert run.stop_reason == "done" and [t.command for t in run.turns] == commands + [None]
    assert [parse_json_action(t.text).done for t in run.turns] == [False, False, True]
    (seg,) = run.segments
    obs = run.turns[0].observation
    assert json.loads(obs)["output"] == outputs[commands[0]]
    words = set(unseen)
    hidden = {w for w in re.findall(r"[a-z]+|[0-9]+", outputs[commands[0]]) if w in words or w.isdigit()} - set(
        re.findall(r"[a-z]+|[0-9]+", instruction))
    assert len(hidden) == 1, (proc.name, instruction, outputs)  # the shown slot: in the output, not the instruction
    for w in re.findall(r"[a-z]+", commands[0]):
      assert w not in words or w in instruction, (proc.name, commands[0])
    (v,) = hidden
    said, done = _value_tokens(tokenizer, obs, v), _value_tokens(tokenizer, bc.reply(commands[1]), v)
    assert done and done <= said, (proc.name, obs, commands[1], v, said, done)
    # the sample trains exactly the three replies, each ended by <|im_end|>
    gen = seg.ids[seg.gen_mask > 0]
    want = "<|im_end|>".join([bc.reply(c) for c in commands] + [bc.done_reply()]) + "<|im_end|>"
    assert tokenizer.decode(list(gen)) == want
  with pytest.raises(ValueError, match="did not end with done .*max_turns 2 < 3 turns"):
    bc.procedure_episode(_harness(tokenizer, 2), tokenizer, *ps[0])


@pytest.mark.slow
def test_the_copy_check_script_trains_a_compact_model_on_some_shapes_and_reports_by_shape():
  """scripts/base_corpus_check.py end to end at a toy size: --compact and --shapes reach the model and the
  measures (the vocabulary's size is printed, the by-shape line names the chosen shapes only), and a bad shape
  name is a usage error naming the shapes."""
  import os
  import subprocess
  import sys

  from rsi_jax.config import REPO_ROOT
  script = [sys.executable, "scripts/base_corpus_check.py"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1")
  p = subprocess.run([*script, "--compact", "--shapes", "rm,ls", "--pairs", "16", "--batch", "8", "--every", "2",
                      "--eval", "2", "--by-shape", "1"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                     timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]
  assert "16 pairs over" in p.stdout and ", 2 shapes;" in p.stdout, p.stdout
  (vocab,) = re.findall(r"^compact vocabulary: (\d+) ids \(of 151669\)$", p.stdout, re.M)
  assert 128 <= int(vocab) < 2000 and int(vocab) % 128 == 0
  (rows,) = re.findall(r"^rows of (\d+) tokens$", p.stdout, re.M)  # fitted to rm and ls, not a fixed 80
  assert int(rows) % 8 == 0 and 32 <= int(rows) <= 56, rows
  assert re.search(r"^update 2 \(\d+ s\): nll/token [\d.]+; unseen [\d.]+; seen, new pairs [\d.]+$", p.stdout, re.M)
  (line,) = [x for x in p.stdout.splitlines() if x.startswith("unseen, by shape")]
  assert sorted(w.split()[0] for w in line.split(": ", 1)[1].split(", ")) == ["ls", "rm"], line
  bad = subprocess.run([*script, "--shapes", "rm,nope"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
  assert bad.returncode == 2 and "--shapes: no shape nope (shapes: echo-new," in bad.stderr, bad.stderr
  for args, says in ((["--pairs", "16", "--batch", "8", "--cosine"], "--cosine: the run has 2 updates, not more "
                      "than its warmup of 50"), (["--cosine", "--checkpoint", "x"], "--cosine trains a model of its own"),
                     (["--warmup", "5"], "--warmup is --cosine's warmup"),
                     (["--runbooks", "4"], "--runbooks measures a --checkpoint")):
    bad = subprocess.run([*script, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and says in bad.stderr, bad.stderr


COPY_SHAPES = "rm,ls,cat,mv,tail,sort"


def _copy_checks(tmp_path) -> dict[bool, tuple[float, list[tuple[dict, dict]]]]:
  """scripts/base_corpus_check.py at CI's size, the corpus and its broken variant side by side (two processes: on
  2 cores they finish together ~1.2x sooner than one after the other): the 8-layer tiny model, compact
  vocabulary, six one- and two-value shapes, 16,000 fresh pairs (1,000 updates of 16), the rate warmed up and
  decayed on a cosine. {broken: (exact match on the 68 pairs over values the corpus never holds, the (want, got)
  commands it prints)}."""
  import os
  import subprocess
  import sys

  from rsi_jax.config import REPO_ROOT
  logs = {broken: (tmp_path / f"copy_broken_{broken}.out", tmp_path / f"copy_broken_{broken}.err")
          for broken in (False, True)}  # files, not pipes: neither process can block on a full pipe
  files = {broken: (out.open("w"), err.open("w")) for broken, (out, err) in logs.items()}
  procs = {broken: subprocess.Popen(
      [sys.executable, "scripts/base_corpus_check.py", "--compact", "--shapes", COPY_SHAPES, "--pairs", "16000",
       "--every", "1000", "--by-shape", "0", "--cosine", *(["--broken"] if broken else []),
       "model_name=qwen3-tiny-8x128"], cwd=REPO_ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1"),
      stdout=files[broken][0], stderr=files[broken][1]) for broken in (False, True)}
  out = {}
  try:
    for broken, p in procs.items():
      p.wait(timeout=1800)
      stdout, stderr = (f.read_text() for f in logs[broken])
      assert p.returncode == 0, stderr[-3000:]
      assert "learning rate: warmup 50, cosine to 1% at update 1000" in stdout, stdout
      (em,) = re.findall(r"^update 1000 \(\d+ s\): nll/token [\d.]+; unseen ([\d.]+);", stdout, re.M)
      wants = [json.loads(x) for x in re.findall(r"^  want (.*)$", stdout, re.M)]
      gots = [json.loads(x) for x in re.findall(r"^  got  (.*)$", stdout, re.M)]
      out[broken] = float(em), list(zip(wants, gots))
  finally:
    for p in procs.values():
      p.kill()
      p.wait()
    for f in [f for pair in files.values() for f in pair]:
      f.close()
  return out


@pytest.mark.slow
def test_the_corpus_teaches_copying_unseen_values_and_its_broken_variant_does_not(tmp_path):
  """The stand-in Base's corpus at CI's size (the two runs side by side: about 10 minutes on 2 cores): the model
  copies values it never saw into the command (>= 0.9 exact match; 0.956 measured), and the broken variant, whose
  commands draw their values afresh, trains the same model on the same instructions and programs to copy none,
  while still writing the instruction's program and flags as the reply's JSON (it fails at copying, not at the
  format)."""
  runs = _copy_checks(tmp_path)
  em, _ = runs[False]
  assert em >= 0.9, em
  em_broken, misses = runs[True]
  assert em_broken <= 0.05, em_broken
  assert len(misses) == 2, misses
  for want, got in misses:  # the right program and flags, other values
    assert got["done"] is False and got["command"] != want["command"], (want, got)
    assert got["command"].split()[0] == want["command"].split()[0], (want, got)


def test_the_copy_check_pads_rows_to_its_longest_pair_and_leaves_the_sampler_room(tokenizer, pools):
  """fit_seq_len (SFTCheck's rows for base_corpus_check.py): the shortest multiple of 8 that holds every pair's
  row (prompt, reply, <|im_end|>), unless the sampler's cache (twice the row) needs more for the longest prompt
  and the reply limit."""
  from rsi_jax.models import ChatRenderer
  from tests.rl.test_sft_learning import fit_seq_len, prompt_ids
  renderer = ChatRenderer(tokenizer)
  ps = [(i, bc.reply(c)) for i, c in bc.pairs(200, 0, pools[0])]
  prompts = [len(prompt_ids(renderer, i)) for i, _ in ps]
  rows = [n + len(tokenizer.encode(r)) + 1 for n, (_, r) in zip(prompts, ps)]
  t = fit_seq_len(rows, prompts, max_new_tokens=8)
  assert t % 8 == 0 and max(rows) <= t < max(rows) + 8, (t, max(rows))
  longest_prompt = max(prompts)
  t = fit_seq_len(rows, prompts, max_new_tokens=200)
  assert t % 8 == 0 and longest_prompt + 200 <= 2 * t < longest_prompt + 200 + 16, (t, longest_prompt)


def test_procedures_come_in_several_sentences_whose_words_are_never_a_drawn_value(pools):
  """Each procedure has four or more phrasings (sentence frames: what lets a Base map an instruction it has not
  seen to its program), every one naming the values its commands take from the instruction; the paraphrases'
  words are never a value of a procedure's draw, and they leave the value pools -- and so every pair -- as
  they were (the pools leave out the shapes' and the first phrasings' words only)."""
  seen, unseen = pools
  extra = bc.paraphrase_words() - bc.shape_words()
  assert extra
  assert {"whichever", "locate", "stored"} <= extra  # paraphrase words that are pool values otherwise
  assert extra & set(seen)  # ... and so have to be screened out of the procedures' draws
  for p in bc.PROCEDURES:
    assert len(p.all_phrasings) >= 4, p.name
    given = set(re.findall(r"\{(\w)\}", p.read)) | (set(re.findall(r"\{(\w)\}", p.act))
                                                     - set(re.findall(r"\{(\w)\}", p.output)))
    for phrasing in p.all_phrasings:
      assert set(re.findall(r"\{(\w)\}", phrasing)) == given, (p.name, phrasing)
  for instruction, outputs, commands in bc.procedures(30 * len(bc.PROCEDURES), 0, seen):
    drawn = set(re.findall(r"[a-z]+", " ".join([*outputs.values(), *commands]))) & set(seen)
    assert not drawn & extra, (instruction, drawn & extra)
  for _, instruction, outputs, commands in bc.runbook_tasks(200, 0, seen, procedures=True):
    assert not set(re.findall(r"[a-z]+", " ".join(commands))) & set(seen) & extra, instruction
  used = set()  # which sentence each episode's instruction is: the paraphrases are drawn, not only the first two
  for k, (instruction, *_) in enumerate(bc.procedures(40 * len(bc.PROCEDURES), 0, seen)):
    p = bc.PROCEDURES[k % len(bc.PROCEDURES)]
    (j,) = [j for j, t in enumerate(p.all_phrasings)
            if re.fullmatch(re.sub(r"\\\{\w\\\}", r"\\w+", re.escape(t)), instruction)]
    used.add((p.name, j))
  assert used == {(p.name, j) for p in bc.PROCEDURES for j in range(len(p.all_phrasings))}
