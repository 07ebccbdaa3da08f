"""A generated task family suite for the learning check (``scripts/learn_check.sh``): real Harbor-layout task
folders from templates, each solved by one shell command (in the multi-step families, two or three), verified
by its own pytest tests in the sandbox (one check per task, which an untouched container fails: no reward for
doing nothing).

Six templates (the task's family is the template's name), each with parameters drawn from small vocabularies
of file names and words:

==============  =====================================================  ==========================================
family          instruction (abridged)                                 reference solution
==============  =====================================================  ==========================================
write-word      create /app/{a}.txt holding the line {w}               ``echo {w} > /app/{a}.txt``
copy-file       copy /app/data/{a}.txt to /app/{b}.txt                 ``cp /app/data/{a}.txt /app/{b}.txt``
make-dir        create the directory /app/{a}/{b}                      ``mkdir -p /app/{a}/{b}``
count-lines     the number of lines of /app/data/{a}.txt -> {b}.txt    ``wc -l < /app/data/{a}.txt > ...``
upper-case      /app/data/{a}.txt in upper case -> /app/{b}.txt        ``tr a-z A-Z < ... > /app/{b}.txt``
find-word       the lines of /app/data/log.txt holding {w} -> {b}.txt  ``grep {w} /app/data/log.txt > ...``
==============  =====================================================  ==========================================

and four multi-step families (:data:`MULTI_STEP_TEMPLATES`), where a value the last command needs is in a file,
not in the instruction: the reference solution reads it first (2-3 commands; ``c``, ``n``: the hidden value)

==============  =====================================================  ==========================================
family          instruction (abridged)                                 reference solution
==============  =====================================================  ==========================================
pointer-copy    /app/data/{a}.txt names a file there; copy it -> {b}   ``cat /app/data/{a}.txt``; ``cp ...{c}.txt``
find-file       the one file of /app/data holding {w}: its name -> {b}  ``grep -l {w} /app/data/*.txt``; ``echo``
count-dir       create /app/{b}/N, N the line count of data/{a}.txt    ``wc -l < /app/data/{a}.txt``; ``mkdir``
find-move       make /app/{b}, copy the file holding {w} into it       ``grep -l``; ``mkdir -p``; ``cp``
==============  =====================================================  ==========================================

A suite is of the one-command families unless it names others (a family, or a set of :data:`TEMPLATE_SETS`).
:func:`make_suite` writes a train split and a held-out split that share no (template, parameters)
combination: per template, the combinations are shuffled with the seed and dealt to held-out first, then
train, then (when asked for) a third split, ``base``: the warm start's demonstrations, which stand in for what
a pre-trained base saw -- none of them in the pool the later phases train on, nor in the held-out split. Data files (inputs the commands read) are derived from the parameters, so a task folder is the same for
the same seed. ``python scripts/make_learn_tasks.py OUT`` writes a suite from the command line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import random
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

NAMES = ("alpha", "beta", "gamma", "delta", "notes", "report", "items", "batch")
WORDS = ("apple", "banana", "cherry", "lemon", "mango", "olive", "pepper", "tomato")
LOG_WORDS = ("error", "warning", "info", "debug")


def _lines(key: str, n: int) -> list[str]:
  rng = random.Random(hashlib.sha256(key.encode()).hexdigest())
  return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) for _ in range(n)]


def _count(key: str) -> int:
  return 2 + int(hashlib.sha256(key.encode()).hexdigest(), 16) % 8


@dataclasses.dataclass(frozen=True)
class Template:
  name: str
  params: Callable[[], list[tuple]]  # every parameter combination
  instruction: Callable[..., str]
  solution: Callable[..., str]
  files: Callable[..., dict]  # {path under /app: content}
  checks: Callable[..., str]  # pytest source (functions) checking the outcome
  hidden: int = 0  # trailing parameters the instruction does not give (read from a file): kept out of the name


def _log(w: str) -> list[str]:
  rng = random.Random(f"log-{w}")
  lines = [f"{rng.choice(LOG_WORDS)}: {' '.join(rng.sample(WORDS, 2))} {i}" for i in range(12)]
  return lines + [f"info: {w} checked"]


TEMPLATES = (
    Template(
        "write-word", lambda: list(itertools.product(NAMES, WORDS)),
        lambda a, w: f"Create the file /app/{a}.txt containing exactly one line: {w}",
        lambda a, w: f"echo {w} > /app/{a}.txt",
        lambda a, w: {},
        lambda a, w: (f"def test_file_holds_the_word():\n"
                      f"  assert Path('/app/{a}.txt').read_text() == {w + chr(10)!r}\n")),
    Template(
        "copy-file", lambda: [p for p in itertools.permutations(NAMES, 2)],
        lambda a, b: f"Copy the file /app/data/{a}.txt to /app/{b}.txt",
        lambda a, b: f"cp /app/data/{a}.txt /app/{b}.txt",
        lambda a, b: {f"data/{a}.txt": "\n".join(_lines(f"copy-{a}-{b}", 4)) + "\n"},
        lambda a, b: (f"def test_copy_is_identical():\n"
                      f"  assert Path('/app/{b}.txt').read_bytes() == Path('/tests/data/{a}.txt').read_bytes()\n")),
    Template(
        "make-dir", lambda: [p for p in itertools.permutations(NAMES, 2)],
        lambda a, b: f"Create the directory /app/{a}/{b}",
        lambda a, b: f"mkdir -p /app/{a}/{b}",
        lambda a, b: {},
        lambda a, b: (f"def test_directory_exists():\n"
                      f"  assert Path('/app/{a}/{b}').is_dir()\n")),
    Template(
        "count-lines", lambda: [p for p in itertools.permutations(NAMES, 2)],
        lambda a, b: f"Write the number of lines in /app/data/{a}.txt to /app/{b}.txt",
        lambda a, b: f"wc -l < /app/data/{a}.txt > /app/{b}.txt",
        lambda a, b: {f"data/{a}.txt": "\n".join(_lines(f"count-{a}-{b}", _count(f"{a}-{b}"))) + "\n"},
        lambda a, b: (f"def test_count():\n"
                      f"  assert Path('/app/{b}.txt').read_text().strip() == '{_count(f'{a}-{b}')}'\n")),
    Template(
        "upper-case", lambda: [p for p in itertools.permutations(NAMES, 2)],
        lambda a, b: f"Write the contents of /app/data/{a}.txt in upper case to /app/{b}.txt",
        lambda a, b: f"tr a-z A-Z < /app/data/{a}.txt > /app/{b}.txt",
        lambda a, b: {f"data/{a}.txt": "\n".join(_lines(f"upper-{a}-{b}", 3)) + "\n"},
        lambda a, b: (f"def test_upper_case():\n"
                      f"  assert Path('/app/{b}.txt').read_text() == Path('/tests/data/{a}.txt').read_text().upper()\n")),
    Template(
        "find-word", lambda: list(itertools.product(WORDS, NAMES)),
        lambda w, b: f"Write every line of /app/data/log.txt that contains the word {w} to /app/{b}.txt",
        lambda w, b: f"grep {w} /app/data/log.txt > /app/{b}.txt",
        lambda w, b: {"data/log.txt": "\n".join(_log(w)) + "\n"},
        lambda w, b: (f"def test_matching_lines():\n"
                      f"  want = [x for x in Path('/tests/data/log.txt').read_text().splitlines() if {w!r} in x]\n"
                      f"  assert Path('/app/{b}.txt').read_text().splitlines() == want\n")),
)


def _others(key: str, exclude, k: int) -> list[str]:
  """``k`` of :data:`NAMES` other than ``exclude``, drawn by ``key`` (decoy files beside the one a task is about)."""
  return random.Random(f"others-{key}").sample([x for x in NAMES if x not in exclude], k)


def _lines_without(key: str, n: int, w: str) -> list[str]:
  rng = random.Random(f"without-{key}")
  words = [x for x in WORDS if x != w]
  return [" ".join(rng.sample(words, rng.randint(1, 3))) for _ in range(n)]


def _with_word(key: str, w: str) -> str:
  """A data file's text with ``w`` on one of its lines (the file a find task is about)."""
  lines = _lines_without(key, 4, w)
  k = int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(lines)
  lines[k] = f"{lines[k]} {w}"
  return "\n".join(lines) + "\n"


def _decoys(key: str, exclude, w: str = "") -> dict:
  return {f"data/{x}.txt": "\n".join(_lines_without(f"{key}-{x}", 3, w)) + "\n" for x in _others(key, exclude, 2)}


def _word_holder(kind: str) -> Callable[..., dict]:
  """The data files of a find task (w, b, c): ``c`` holds the word ``w``, two decoys do not."""
  return lambda w, b, c: {f"data/{c}.txt": _with_word(f"{kind}-{w}-{b}-{c}", w),
                          **_decoys(f"{kind}-{w}-{b}-{c}", (b, c), w)}


def _word_and_two_names() -> list[tuple]:
  return [(w, b, c) for w in WORDS for b, c in itertools.permutations(NAMES, 2)]


# Multi-step families: what the instruction asks for depends on a file's contents, so the reference solution
# first reads (its output decides the next command), then acts; 2-3 commands. A sampled episode that verifies
# can carry wasted or wrong turns before the ones that did the work -- what a rewrite into a runbook removes.
MULTI_STEP_TEMPLATES = (
    Template(
        "pointer-copy", lambda: list(itertools.permutations(NAMES, 3)),
        lambda a, b, c: (f"The file /app/data/{a}.txt holds the name of another file in /app/data. "
                         f"Copy that file to /app/{b}.txt"),
        lambda a, b, c: f"cat /app/data/{a}.txt\ncp /app/data/{c}.txt /app/{b}.txt",
        lambda a, b, c: {f"data/{a}.txt": f"{c}.txt\n",
                         f"data/{c}.txt": "\n".join(_lines(f"pointer-{a}-{b}-{c}", 4)) + "\n",
                         **_decoys(f"pointer-{a}-{b}-{c}", (a, b, c))},
        lambda a, b, c: (f"def test_the_named_file_is_copied():\n"
                         f"  assert Path('/app/{b}.txt').read_bytes() == Path('/tests/data/{c}.txt').read_bytes()\n"),
        hidden=1),
    Template(
        "find-file", _word_and_two_names,
        lambda w, b, c: (f"Exactly one file in /app/data contains the word {w}. Write that file's name, without "
                         f"its folder, to /app/{b}.txt"),
        lambda w, b, c: f"grep -l {w} /app/data/*.txt\necho {c}.txt > /app/{b}.txt",
        _word_holder("find"),
        lambda w, b, c: (f"def test_the_file_name():\n"
                         f"  assert Path('/app/{b}.txt').read_text().strip() == '{c}.txt'\n"), hidden=1),
    Template(
        "count-dir", lambda: [(a, b, str(n)) for a, b in itertools.permutations(NAMES, 2) for n in range(2, 10)],
        lambda a, b, n: (f"Count the lines of /app/data/{a}.txt, then create the directory /app/{b}/N where N is "
                         f"that count"),
        lambda a, b, n: f"wc -l < /app/data/{a}.txt\nmkdir -p /app/{b}/{n}",
        lambda a, b, n: {f"data/{a}.txt": "\n".join(_lines(f"count-dir-{a}-{b}-{n}", int(n))) + "\n"},
        lambda a, b, n: (f"def test_one_directory_named_by_the_count():\n"
                         f"  assert sorted(p.name for p in Path('/app/{b}').iterdir()) == ['{n}']\n"
                         f"  assert Path('/app/{b}/{n}').is_dir()\n"), hidden=1),
    Template(
        "find-move", _word_and_two_names,
        lambda w, b, c: (f"Create the directory /app/{b} and copy into it the one file of /app/data that "
                         f"contains the word {w}"),
        lambda w, b, c: f"grep -l {w} /app/data/*.txt\nmkdir -p /app/{b}\ncp /app/data/{c}.txt /app/{b}/",
        _word_holder("move"),
        lambda w, b, c: (f"def test_only_the_file_with_the_word_is_copied():\n"
                         f"  assert sorted(p.name for p in Path('/app/{b}').iterdir()) == ['{c}.txt']\n"
                         f"  got = Path('/app/{b}/{c}.txt').read_bytes()\n"
                         f"  assert got == Path('/tests/data/{c}.txt').read_bytes()\n"),
        hidden=1),
)
BY_NAME = {t.name: t for t in TEMPLATES + MULTI_STEP_TEMPLATES}

TASK_TOML = """version = "1.0"

[metadata]
author_name = "rsi_jax"
difficulty = "easy"
category = "{family}"
tags = ["generated", "learn-check"]

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 120.0

[environment]
build_timeout_sec = 300.0
cpus = 1
memory = "512M"
storage = "256M"
"""

TEST_SH = """#!/bin/bash
unset PYTEST_ADDOPTS
mkdir -p /logs/verifier
cd /tests || exit 1
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 /usr/bin/python3 -I -m pytest -p ctrf.main -p no:cacheprovider \\
  --ctrf /logs/verifier/ctrf.json -rA test_outputs.py
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def task_name(template: Template, params: tuple) -> str:
  """``<family>-<parameters>``; a hidden parameter is not spelled out (a short hash of all of them instead), so a
  task's name, which a log or a container label may show, does not give away what the agent has to read."""
  if not template.hidden:
    return "-".join((template.name, *params))
  shown = params[:len(params) - template.hidden]
  return "-".join((template.name, *shown, hashlib.sha256("-".join(params).encode()).hexdigest()[:6]))


def write_task(root: Path, template: Template, params: tuple, base_image: str = "rsi-base") -> Path:
  """One Harbor-layout task folder ``root/<template>-<params>``."""
  d = root / task_name(template, params)
  if d.exists():
    shutil.rmtree(d)
  (d / "environment").mkdir(parents=True)
  (d / "solution").mkdir()
  (d / "tests").mkdir()
  files = template.files(*params)
  docker = [f"FROM {base_image}", "WORKDIR /app"]
  for rel, text in files.items():
    for where in (d / "environment" / rel, d / "tests" / rel):  # the tests keep a pristine copy of the inputs
      where.parent.mkdir(parents=True, exist_ok=True)
      where.write_text(text)
  if files:
    docker.append("COPY data /app/data")
  (d / "environment" / "Dockerfile").write_text("\n".join(docker) + "\n")
  (d / "instruction.md").write_text(template.instruction(*params) + "\n")
  (d / "task.toml").write_text(TASK_TOML.format(family=template.name))
  (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{template.solution(*params)}\n")
  (d / "tests" / "test.sh").write_text(TEST_SH)
  (d / "tests" / "test_outputs.py").write_text(
      f'"""Generated checks for {d.name}."""\n\nfrom pathlib import Path\n\n\n{template.checks(*params)}')
  for f in (d / "solution" / "solve.sh", d / "tests" / "test.sh"):
    f.chmod(0o755)
  return d


TEMPLATE_SETS = {"one-command": TEMPLATES, "multi-step": MULTI_STEP_TEMPLATES}


def selected(names: Sequence[str] = ()) -> tuple[Template, ...]:
  """The templates ``names`` selects, in declaration order: template names or set names (:data:`TEMPLATE_SETS`);
  none: the one-command set (the learning check's design)."""
  known = set(BY_NAME) | set(TEMPLATE_SETS)
  unknown = sorted(set(names) - known)
  if unknown:
    raise ValueError(f"unknown template(s) {unknown}; known: {sorted(known)}")
  if not names:
    return TEMPLATES
  want = {t.name for n in names for t in TEMPLATE_SETS.get(n, (BY_NAME.get(n),))}
  return tuple(t for t in TEMPLATES + MULTI_STEP_TEMPLATES if t.name in want)


def _one_per_instruction(t: Template, seed: int) -> list[tuple]:
  """The template's parameter combinations, sorted; of those that differ only in hidden parameters (one
  instruction), one drawn by the seed, so no instruction is in two splits."""
  if not t.hidden:
    return sorted(t.params())
  groups: dict[tuple, list[tuple]] = {}
  for p in sorted(t.params()):
    groups.setdefault(p[:len(p) - t.hidden], []).append(p)
  rng = random.Random(f"{seed}-{t.name}-hidden")
  return [rng.choice(g) for _, g in sorted(groups.items())]


def split(seed: int, train_per_template: int, heldout_per_template: int,
          templates: Sequence[str] = (), base_per_template: int = 0,
          val_per_template: int = 0) -> dict[str, list[tuple[Template, tuple]]]:
  """{"train": [...], "heldout": [...]} (and "base" when ``base_per_template``, "val" when ``val_per_template``:
  a validation split for choices that must not look at held-out, e.g. the learning check's discovery gate) of
  (template, parameters); no combination is in two splits. Held-out and train depend on neither extra split,
  base not on val."""
  sizes = {"heldout": heldout_per_template, "train": train_per_template, "base": base_per_template,
           "val": val_per_template}
  out: dict[str, list] = {k: [] for k, n in sizes.items() if n or k in ("heldout", "train")}
  for t in selected(templates):
    combos = _one_per_instruction(t, seed)
    random.Random(f"{seed}-{t.name}").shuffle(combos)
    if sum(sizes.values()) > len(combos):
      what = "instructions" if t.hidden else "parameter combinations"
      raise ValueError(f"template {t.name} has {len(combos)} {what}, fewer than "
                       f"{heldout_per_template} held-out + {train_per_template} train"
                       + (f" + {base_per_template} base" if base_per_template else "")
                       + (f" + {val_per_template} val" if val_per_template else ""))
    start = 0
    for k, n in sizes.items():
      if k in out:
        out[k] += [(t, p) for p in combos[start:start + n]]
      start += n
  return out


def make_suite(out_dir, *, seed: int = 0, train_per_template: int = 24, heldout_per_template: int = 4,
               templates: Sequence[str] = (), base_image: str = "rsi-base",
               base_per_template: int = 0, val_per_template: int = 0) -> dict[str, Path]:
  """Write ``out_dir/train`` and ``out_dir/heldout`` (``out_dir/base`` / ``out_dir/val`` too when asked for, and
  ``out_dir/suite.json``: what was generated); returns {split: path}."""
  chosen = selected(templates)
  out = Path(out_dir)
  parts = split(seed, train_per_template, heldout_per_template, templates, base_per_template, val_per_template)
  paths = {}
  for name, items in parts.items():
    root = out / name
    if root.exists():
      shutil.rmtree(root)
    root.mkdir(parents=True)
    for t, p in items:
      write_task(root, t, p, base_image)
    paths[name] = root
  (out / "suite.json").write_text(json.dumps(
      {"seed": seed, "train_per_template": train_per_template, "heldout_per_template": heldout_per_template,
       "base_per_template": base_per_template, "val_per_template": val_per_template,
       "templates": [t.name for t in chosen],
       **{k: [task_name(t, p) for t, p in v] for k, v in parts.items()}}, indent=1) + "\n")
  return paths


def write_run_file(paths: dict[str, Path], config: str | Path, out: str | Path) -> Path:
  """A run file over ``config`` (e.g. configs/learn_check.yml) that trains on the suite's train split,
  evaluates on its held-out split and gives the Base phase (``rsr0``) the base split, when there is one."""
  lines = [f"base_config: {Path(config).resolve()}", f"env: {{tasks_dir: {paths['train']}}}",
           f"eval: {{tasks_dir: {paths['heldout']}}}"]
  if "base" in paths:
    lines.append(f"pipeline: {{phase_overrides: {{rsr0: {{env: {{tasks_dir: {paths['base']}}}}}}}}}")
  out = Path(out)
  out.write_text("\n".join(lines) + "\n")
  return out


FAILURE_MODES = ("wrong arguments", "other command", "malformed", "no command")


def reference_commands(task_dir: str | Path) -> list[str]:
  """The commands of a task's reference solution (``solution/solve.sh``; one for a one-command task, two or
  three for a multi-step one): what a failed attempt's actions are told apart by."""
  lines = [x.strip() for x in (Path(task_dir) / "solution" / "solve.sh").read_text().splitlines()]
  return [x for x in lines if x and not x.startswith("#")]


def failure_mode(actions: Sequence[str], reference: Sequence[str]) -> str:
  """Why a failed attempt failed, from its first action that departs from the reference solution's commands
  in order (an evaluation attempt record's ``actions``; for a one-command task, its first action): ``wrong
  arguments`` (the reference step's program, e.g. ``mkdir`` for ``mkdir -p /app/a/b``, with other arguments),
  ``other command`` (another program: a template the actor does not know, or confused), ``malformed`` (no
  valid JSON action) or ``no command`` (declared done, or said nothing runnable, before the reference's last
  step). An attempt that issued every reference command verbatim is judged by the last one."""
  same = lambda a, b: a.split() == b.split()  # noqa: E731  (whitespace aside)
  step = next((i for i, ref in enumerate(reference) if i >= len(actions) or not same(actions[i], ref)),
              len(reference) - 1)
  act = actions[step] if step < len(actions) else ""
  if act in ("<done>", ""):
    return "no command"
  if act.startswith("<malformed"):
    return "malformed"
  words = act.split()
  return "wrong arguments" if words and words[0] == reference[step].split()[0] else "other command"


def failure_modes(records: Sequence[dict], tasks_dir: str | Path) -> dict[str, int]:
  """Counts of :data:`FAILURE_MODES` over the failed, scored attempts of ``records`` (``attempts.jsonl``
  rows) on the tasks of ``tasks_dir``; attempts that succeeded or were infrastructure failures are not
  counted."""
  refs: dict[str, list[str]] = {}
  out = dict.fromkeys(FAILURE_MODES, 0)
  for r in records:
    if r["success"] or r["infra_failure"]:
      continue
    if r["task"] not in refs:
      refs[r["task"]] = reference_commands(Path(tasks_dir) / r["task"])
    out[failure_mode(r.get("actions", []), refs[r["task"]])] += 1
  return out
