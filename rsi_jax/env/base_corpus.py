"""The stand-in Base's generated corpus: broad single-turn (instruction -> one shell command) pairs that teach a
from-scratch tiny model to copy an instruction's values into the command it writes.

A pre-trained base model reads "copy /app/x to /app/y" and writes ``cp /app/x /app/y`` for any x and y; the
learning check's tiny model, trained from random weights on a few dozen demonstrations per template, learns
each template's program but copies the instruction's parameters only partly (the wrong-argument failures of
``scripts/learn_check_table.py``). This corpus is what it learns first, so that its Base behaves like a
pre-trained one in that respect. It is a STAND-IN for pre-training, labelled as such wherever it is used.

* :data:`SHAPES`: many programs and argument shapes (files, directories, words, numbers; one to three values;
  single commands and two-step ``&&`` / ``|`` procedures), each with three or four phrasings of its instruction
  (different verbs and sentence frames), and every draw a :func:`variant`: its first path a folder deeper, its
  files another extension, so that a program is tied to its words, not to one sentence, folder or extension;
* :func:`value_pools`: the values the corpus draws from (thousands of words), and values kept out of it, on
  which copying is measured. Neither shares a value with the learning check's tasks (the names and words of
  :mod:`rsi_jax.env.learn_tasks`), so no corpus pair is one of the check's train, held-out or base task
  combinations;
* :func:`pairs`: ``n`` seeded pairs; ``broken=True`` is the broken variant: the same instructions and
  programs, but each command's values drawn afresh (the format without the copying), which must not teach
  copying;
* :data:`PROCEDURES`, :func:`procedures`, :func:`procedure_episode`: two-step episodes (read a value the
  instruction does not give, act on it, done), recorded by a chat harness's own loop in a :class:`CorpusShell`.
* :func:`runbook_tasks`: the tasks of the corpus's runbooks: for each, the planning call (I_plan over the
  instruction and the commands' transcript -> a runbook whose steps are those commands) and the execution
  that follows it (the harness's turns under the runbook as private guidance), so that the Base writes and
  follows runbooks as RSR asks of a pre-trained one.

``rsr.policy: corpus`` trains on this corpus in the training program (``configs/stand_in_base.yml``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re

from rsi_jax.env import learn_tasks

NUMBERS = tuple(range(2, 40))
# a variant's folder for its first value's path (/app/{d}/{a}) and its files' extension (:func:`variant`)
DIRS = ("data", "src", "logs", "input", "files", "docs", "work", "share")
EXTS = ("txt", "md", "log", "csv")
EXTENSION = re.compile(rf"\.(?:{'|'.join(EXTS)})\b")  # an extension of EXTS in a template
# the learning check's own vocabulary, which no corpus value may be
CHECK_VALUES = frozenset(learn_tasks.NAMES) | frozenset(learn_tasks.WORDS) | frozenset(learn_tasks.LOG_WORDS)


def value_pools(tokenizer) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(corpus values, unseen values): the lowercase words of 4-9 letters that the tokenizer holds as one token
  with a leading space (about 18,700 for Qwen3), less the learning check's own names and words and the shapes'
  own words (programs, "file", ...); one in ten (by a hash of the word, the same on every machine) is kept out of
  the corpus, to measure copying on. Drawing from thousands of values, the model cannot recall a value from
  training: it has to copy it."""
  words = sorted({w[1:] for w in tokenizer.vocab()
                  if w.startswith("\u0120") and re.fullmatch(r"[a-z]{4,9}", w[1:])} - CHECK_VALUES - shape_words())
  unseen = {w for w in words if hashlib.sha256(w.encode()).digest()[0] % 10 == 0}
  return tuple(w for w in words if w not in unseen), tuple(sorted(unseen))


@dataclasses.dataclass(frozen=True)
class Shape:
  """One program and argument shape: instruction phrasings and the command, over named slots (``a``, ``b``,
  ``c``: values used as file or directory names; ``w``, ``v``: values used as words; ``n``: a number)."""
  name: str
  phrasings: tuple[str, ...]
  command: str

  @property
  def slots(self) -> tuple[str, ...]:
    return tuple(dict.fromkeys(re.findall(r"\{(\w)\}", self.command)))


SHAPES = (
    Shape("echo-new", ("Put the single word {w} in the file /app/{a}.txt",
                       "Write {w} to /app/{a}.txt, replacing what it holds",
                 "Create /app/{a}.txt with the single line {w}",
                 "The file /app/{a}.txt should hold exactly one line: {w}"), "echo {w} > /app/{a}.txt"),
    Shape("echo-append", ("Add a line {w} at the end of /app/{a}.log", "Append the word {w} to /app/{a}.log",
                 "Write {w} as a new last line of /app/{a}.log",
                 "Add one more line, holding the word {w}, to /app/{a}.log"),
          "echo {w} >> /app/{a}.log"),
    Shape("printf-two", ("Write two lines, {w} then {v}, to /app/{a}.txt",
                         "Make /app/{a}.txt hold the lines {w} and {v}",
                 "Create /app/{a}.txt with exactly two lines: {w} and then {v}"),
          "printf '%s\\n' {w} {v} > /app/{a}.txt"),
    Shape("cp", ("Duplicate /app/{a}.csv as /app/{b}.csv", "Make a copy of /app/{a}.csv named /app/{b}.csv",
                 "Copy the file /app/{a}.csv to /app/{b}.csv",
                 "Create /app/{b}.csv as an exact copy of /app/{a}.csv"),
          "cp /app/{a}.csv /app/{b}.csv"),
    Shape("cp-dir", ("Copy the folder /app/{a} with everything in it to /app/{b}",
                     "Recursively copy /app/{a} to /app/{b}",
                 "Copy the directory /app/{a} and all of its contents to /app/{b}"), "cp -r /app/{a} /app/{b}"),
    Shape("mv", ("Rename /app/{a}.txt to /app/{b}.txt", "Move the file /app/{a}.txt to /app/{b}.txt",
                 "Change the name of the file /app/{a}.txt to /app/{b}.txt"),
          "mv /app/{a}.txt /app/{b}.txt"),
    Shape("rm", ("Delete the file /app/{a}.tmp", "Remove /app/{a}.tmp",
                 "Get rid of the file /app/{a}.tmp"), "rm -f /app/{a}.tmp"),
    Shape("touch", ("Create an empty file /app/{a}.md", "Make a new empty file called /app/{a}.md",
                 "Create the file /app/{a}.md, leaving it empty"),
          "touch /app/{a}.md"),
    Shape("mkdir", ("Make the nested folder /app/{b}/{a}", "Create the folder /app/{b}/{a}",
                 "Create the directory /app/{b}/{a}",
                 "Make a new directory at /app/{b}/{a}, with its parent"),
          "mkdir -p /app/{b}/{a}"),
    Shape("mkdir-two", ("Create the folders /app/{a} and /app/{b}", "Make two directories, /app/{a} and /app/{b}",
                 "Create two directories: /app/{a} and /app/{b}"),
          "mkdir -p /app/{a} /app/{b}"),
    Shape("ls", ("List what is in the folder /app/{a}", "Show the files in /app/{a}",
                 "Which files does the directory /app/{a} hold? List them"), "ls /app/{a}"),
    Shape("cat", ("Print the file /app/{a}.txt", "Show the contents of /app/{a}.txt",
                 "Print the contents of the file /app/{a}.txt",
                 "Display /app/{a}.txt"), "cat /app/{a}.txt"),
    Shape("cat-join", ("Join /app/{a}.txt and /app/{b}.txt into /app/{c}.txt",
                       "Concatenate /app/{a}.txt then /app/{b}.txt and save it as /app/{c}.txt",
                 "Write the contents of /app/{a}.txt followed by those of /app/{b}.txt to /app/{c}.txt"),
          "cat /app/{a}.txt /app/{b}.txt > /app/{c}.txt"),
    Shape("head", ("Save the first {n} lines of /app/{a}.log to /app/{b}.log",
                   "Keep the top {n} lines of /app/{a}.log in /app/{b}.log",
                 "Write the first {n} lines of /app/{a}.log to /app/{b}.log"),
          "head -n {n} /app/{a}.log > /app/{b}.log"),
    Shape("tail", ("Show the last {n} lines of /app/{a}.log", "Print the final {n} lines of /app/{a}.log",
                 "Display the last {n} lines of the file /app/{a}.log"),
          "tail -n {n} /app/{a}.log"),
    Shape("wc-words", ("Count the words in /app/{a}.txt and write the count to /app/{b}.txt",
                       "Store the word count of /app/{a}.txt in /app/{b}.txt",
                 "Write the number of words in /app/{a}.txt to /app/{b}.txt"), "wc -w < /app/{a}.txt > /app/{b}.txt"),
    Shape("wc-lines-save", ("Count the lines in /app/{a}.txt and save the number to /app/{b}.txt",
                            "Store the line count of /app/{a}.txt in /app/{b}.txt",
                            "Write how many lines /app/{a}.txt has to /app/{b}.txt"),
          "wc -l < /app/{a}.txt > /app/{b}.txt"),
    Shape("wc-lines", ("How many lines does /app/{a}.csv have? Print the number",
                       "Print the line count of /app/{a}.csv",
                 "Print the number of lines in /app/{a}.csv",
                 "Count the lines of the file /app/{a}.csv"), "wc -l < /app/{a}.csv"),
    Shape("sort", ("Sort the lines of /app/{a}.txt into /app/{b}.txt",
                   "Write /app/{a}.txt sorted to /app/{b}.txt",
                 "Write the lines of /app/{a}.txt in sorted order to /app/{b}.txt"),
          "sort /app/{a}.txt > /app/{b}.txt"),
    Shape("uniq", ("Write the distinct lines of /app/{a}.txt to /app/{b}.txt",
                   "Save /app/{a}.txt without repeated lines as /app/{b}.txt",
                 "Write each distinct line of /app/{a}.txt once, sorted, to /app/{b}.txt"),
          "sort -u /app/{a}.txt > /app/{b}.txt"),
    Shape("lower", ("Convert /app/{a}.txt to lower case and save it as /app/{b}.txt",
                    "Write /app/{a}.txt in small letters to /app/{b}.txt",
                 "Write the contents of /app/{a}.txt in lower case to /app/{b}.txt",
                 "Save /app/{a}.txt with every letter made lowercase as /app/{b}.txt"),
          "tr A-Z a-z < /app/{a}.txt > /app/{b}.txt"),
    Shape("upper", ("Turn the text of /app/{a}.md into capitals in /app/{b}.md",
                    "Save an all-caps version of /app/{a}.md as /app/{b}.md",
                 "Write the contents of /app/{a}.md in upper case to /app/{b}.md",
                 "Convert /app/{a}.md to upper case and save the result as /app/{b}.md"),
          "tr a-z A-Z < /app/{a}.md > /app/{b}.md"),
    Shape("grep", ("Print the lines of /app/{a}.log that mention {w}", "Show which lines in /app/{a}.log contain {w}",
                 "Print every line of /app/{a}.log that contains the word {w}"),
          "grep {w} /app/{a}.log"),
    Shape("grep-save", ("Collect the lines containing {w} from /app/{a}.log into /app/{b}.log",
                        "Save every line of /app/{a}.log with {w} in it to /app/{b}.log",
                 "Write every line of /app/{a}.log that contains the word {w} to /app/{b}.log",
                 "Save the lines of /app/{a}.log that include {w} in /app/{b}.log"),
          "grep {w} /app/{a}.log > /app/{b}.log"),
    Shape("grep-v", ("Write the lines of /app/{a}.txt without {w} to /app/{b}.txt",
                     "Drop the lines mentioning {w} from /app/{a}.txt, saving the rest as /app/{b}.txt",
                 "Write every line of /app/{a}.txt that does not contain the word {w} to /app/{b}.txt"),
          "grep -v {w} /app/{a}.txt > /app/{b}.txt"),
    Shape("grep-count", ("Count the lines of /app/{a}.log containing {w}",
                         "How many lines of /app/{a}.log mention {w}?",
                 "Print how many lines of /app/{a}.log contain the word {w}"), "grep -c {w} /app/{a}.log"),
    Shape("sed", ("Apply the substitution 's/{w}/{v}/g' to /app/{a}.txt in place",
                  "Edit /app/{a}.txt in place with the sed script 's/{w}/{v}/g'",
                 "In /app/{a}.txt, replace every {w} with {v} using the sed script 's/{w}/{v}/g'"),
          "sed -i 's/{w}/{v}/g' /app/{a}.txt"),
    Shape("find", ("Find the files named {a}.txt anywhere under /app", "Locate every {a}.txt below /app",
                 "Search the whole of /app for files named {a}.txt"),
          "find /app -name {a}.txt"),
    Shape("chmod", ("Make /app/{a}.sh executable", "Give /app/{a}.sh execute permission",
                 "Let /app/{a}.sh be run as a program"), "chmod +x /app/{a}.sh"),
    Shape("tar", ("Pack the folder /app/{a} into the archive /app/{b}.tar.gz",
                  "Compress /app/{a} as /app/{b}.tar.gz",
                 "Create a gzip-compressed tar archive /app/{b}.tar.gz of the folder /app/{a}"),
          "tar -czf /app/{b}.tar.gz /app/{a}"),
    Shape("ln", ("Create a symbolic link /app/{b} pointing to /app/{a}", "Link /app/{b} to /app/{a} symbolically",
                 "Make /app/{b} a symbolic link to /app/{a}"),
          "ln -s /app/{a} /app/{b}"),
    Shape("mkdir-echo", ("Create the folder /app/{a}, then write {w} into /app/{a}/{b}.txt",
                         "Make /app/{a} and put the word {w} in the file /app/{a}/{b}.txt",
                 "Create the directory /app/{a} and in it the file /app/{a}/{b}.txt holding the word {w}"),
          "mkdir -p /app/{a} && echo {w} > /app/{a}/{b}.txt"),
    Shape("cd-touch", ("Go to /app/{a} and create an empty file {b}.txt there",
                       "In the folder /app/{a}, make the empty file {b}.txt",
                 "Change into /app/{a} and make an empty file named {b}.txt"), "cd /app/{a} && touch {b}.txt"),
    Shape("cp-rm", ("Move /app/{a}.csv to /app/{b}.csv by copying it and deleting the original",
                    "Copy /app/{a}.csv to /app/{b}.csv, then remove /app/{a}.csv",
                 "Copy /app/{a}.csv to /app/{b}.csv and delete /app/{a}.csv afterwards"),
          "cp /app/{a}.csv /app/{b}.csv && rm /app/{a}.csv"),
    Shape("sort-head", ("Write the first {n} lines of /app/{a}.txt, sorted, to /app/{b}.txt",
                        "Sort /app/{a}.txt and keep its top {n} lines in /app/{b}.txt",
                 "Sort the lines of /app/{a}.txt and write the first {n} of them to /app/{b}.txt"),
          "sort /app/{a}.txt | head -n {n} > /app/{b}.txt"),
)


@dataclasses.dataclass(frozen=True)
class Procedure:
  """A two-step shape: the instruction says where a value is, not the value; the first command reads it (``read``
  prints ``output``, what a shell would), the second acts on what it printed (``act``), then ``done``. Slots as
  :class:`Shape`'s (``b``, or the number ``n``: the one only the output gives). Every value keeps its neighbour (``/``) in the output
  and the command, so an unseen one is copyable (``test_base_corpus.py`` checks the tokens)."""
  name: str
  phrasings: tuple[str, ...]
  read: str
  output: str
  act: str
  # further phrasings, written after the value pools were fixed: their words leave the procedures' draws
  # (:func:`_procedure_values`), not the pools, so every pair (the CI copy check's) is drawn as before
  paraphrases: tuple[str, ...] = ()

  @property
  def all_phrasings(self) -> tuple[str, ...]:
    return self.phrasings + self.paraphrases


PROCEDURES = (
    Procedure("pointer-ls", ("The file /app/{a}.txt holds the path of a folder. List what is in that folder",
                             "List the folder whose path is written in /app/{a}.txt"),
              "cat /app/{a}.txt", "/app/{b}\n", "ls /app/{b}",
              ("Show what is inside the folder that /app/{a}.txt names",
               "/app/{a}.txt gives a folder's path; list that folder",
               "Read the folder path stored in /app/{a}.txt, then list its contents")),
    Procedure("pointer-cp", ("/app/{a}.link holds the path of a log file. Copy that log to /app/{c}.log",
                             "Copy the log file named in /app/{a}.link to /app/{c}.log"),
              "cat /app/{a}.link", "/app/{b}.log\n", "cp /app/{b}.log /app/{c}.log",
              ("The path of a log is written in /app/{a}.link: make a copy of that log at /app/{c}.log",
               "Look in /app/{a}.link for the path of a log file and copy the log it points to to /app/{c}.log",
               "Put a copy of the log that /app/{a}.link refers to at /app/{c}.log")),
    Procedure("grep-rm", ("Exactly one file in /app/{a} mentions {w}. Delete that file",
                          "Remove the one file of /app/{a} that contains {w}"),
              "grep -l {w} /app/{a}/*.txt", "/app/{a}/{b}.txt\n", "rm /app/{a}/{b}.txt",
              ("Find the file in /app/{a} that has the word {w} in it and delete it",
               "One of the files of /app/{a} contains the word {w}. Remove it",
               "Delete whichever file in /app/{a} includes the word {w}")),
    Procedure("find-cat", ("A file named {a}.md is somewhere under /app. Print its contents",
                           "Show the file {a}.md, which is in some folder below /app"),
              "find /app -name {a}.md", "/app/{b}/{a}.md\n", "cat /app/{b}/{a}.md",
              ("Locate {a}.md under /app and print what it holds", "Show what {a}.md, in a folder below /app, holds")),
    Procedure("ls-rm", ("The folder /app/{a} holds one .tmp file. Delete it", "Remove the only .tmp file in /app/{a}"),
              "ls /app/{a}/*.tmp", "/app/{a}/{b}.tmp\n", "rm /app/{a}/{b}.tmp",
              ("Find the single .tmp file in /app/{a} and remove it", "Delete the one .tmp file inside /app/{a}")),
    Procedure("find-mv", ("Somewhere under /app is a file named {a}.csv. Move it to /app/{c}.csv",
                          "Find {a}.csv below /app and move it to /app/{c}.csv"),
              "find /app -name {a}.csv", "/app/{b}/{a}.csv\n", "mv /app/{b}/{a}.csv /app/{c}.csv",
              ("Locate the file {a}.csv in some folder under /app and rename it to /app/{c}.csv",
               "{a}.csv is in a folder below /app; move it so that it becomes /app/{c}.csv")),
    # a count, a file copied into a folder: kinds of step the multi-step check's families take
    # (learn_tasks.MULTI_STEP_TEMPLATES), in sentences of their own, over the corpus's own values (never the check's
    # names or words, so no pair is one of its task combinations). The paraphrases are what teach the kind of
    # instruction rather than one sentence of it: a Base that learned two sentences per procedure answered the
    # check's own phrasing with another program (count-dir: grep, never wc -l, 45 of 51 held-out attempts). None
    # prints a bare file name that the next command writes after a "/": a value's tokens would differ there
    Procedure("wc-mkdir", ("Create the folder /app/{a}/N, N the number of lines in /app/{c}.txt",
                           "Count the lines of /app/{c}.txt and make a directory of that number in /app/{a}"),
              "wc -l < /app/{c}.txt", "{n}\n", "mkdir -p /app/{a}/{n}",
              ("Find out how many lines /app/{c}.txt has and create a folder named by that number inside /app/{a}",
               "Make the directory /app/{a}/COUNT, where COUNT is the line count of /app/{c}.txt",
               "Count how many lines are in /app/{c}.txt; then create /app/{a}/ followed by that number as a folder",
               "In /app/{a}, create a directory whose name is the number of lines of /app/{c}.txt",
               "Take the number of lines in /app/{c}.txt and make a folder with that number as its name under "
               "/app/{a}")),
    Procedure("grep-cp-into", ("Copy the one file of /app/{a} that contains {w} into the folder /app/{c}",
                               "Of the files in /app/{a}, exactly one mentions {w}: copy it into /app/{c}"),
              "grep -l {w} /app/{a}/*.txt", "/app/{a}/{b}.txt\n", "cp /app/{a}/{b}.txt /app/{c}/",
              ("Find the file in /app/{a} with the word {w} in it and put a copy of it in the folder /app/{c}",
               "One file of /app/{a} has the word {w}; copy that file into /app/{c}",
               "Put into the existing folder /app/{c} a copy of whichever file in /app/{a} includes the word {w}")),
    Procedure("grep-mkdir-cp", (), "grep -l {w} /app/{a}/*.txt", "/app/{a}/{b}.txt\n",
              "mkdir -p /app/{c} && cp /app/{a}/{b}.txt /app/{c}/",
              ("Make a new folder /app/{c} and put in it a copy of the file of /app/{a} that has the word {w}",
               "The word {w} is in just one file of /app/{a}. Create the folder /app/{c} and copy that file into it",
               "Create /app/{c} as a directory, then copy there whichever file in /app/{a} includes the word {w}",
               "Find the file in /app/{a} containing {w}, make the directory /app/{c}, and copy the file into it")),
)


class CorpusShell:
  """The shell a procedure's episode runs in (a stand-in for a machine: the corpus is generated, not executed):
  each command prints what ``outputs`` gives it (exit 0), any other prints nothing."""

  def __init__(self, outputs: dict[str, str]):
    self.outputs = dict(outputs)

  def run(self, command: str, timeout_s: float = 0.0):
    from rsi_jax.env.sandbox import CommandResult
    return CommandResult(self.outputs.get(command, ""), 0, False, 0.0)


def procedures(n: int, seed: int, values) -> list[tuple[str, dict[str, str], list[str]]]:
  """``n`` procedure episodes, seeded (procedures in turn, a random phrasing, distinct values from ``values``):
  (instruction, {command: output}, commands in order)."""
  _check_values(values)
  rng = random.Random(f"base-corpus-procedures-{seed}")
  values = _procedure_values(values)
  out = []
  for k in range(n):
    p = PROCEDURES[k % len(PROCEDURES)]
    v = _draw(rng, values)
    read, act = p.read.format(**v), p.act.format(**v)
    out.append((rng.choice(p.all_phrasings).format(**v), {read: p.output.format(**v)},
                [read, act]))
  return out


def runbook_tasks(n: int, seed: int, values, *, procedures: bool = False
                  ) -> list[tuple[str, str, dict[str, str], list[str]]]:
  """``n`` seeded tasks for the corpus's runbooks (``rsr.corpus_runbooks``; a stream of their own, not the pairs'
  or the procedures'): the shapes in turn, and with ``procedures`` every other one a procedure in turn, each
  with a random phrasing and distinct values from ``values``: (shape or procedure name, instruction,
  {command: output}, commands in order)."""
  _check_values(values)
  rng = random.Random(f"base-corpus-runbooks-{seed}")
  if procedures:
    values = _procedure_values(values)
  out = []
  for k in range(n):
    v = _draw(rng, values)
    if procedures and k % 2:
      p = PROCEDURES[(k // 2) % len(PROCEDURES)]
      read, act = p.read.format(**v), p.act.format(**v)
      out.append((p.name, rng.choice(p.all_phrasings).format(**v), {read: p.output.format(**v)}, [read, act]))
    else:
      s = SHAPES[(k // 2 if procedures else k) % len(SHAPES)]
      instruction, command = variant(s, rng)
      out.append((s.name, instruction.format(**v), {}, [command.format(**v)]))
  return out


def procedure_episode(harness, tokenizer, instruction: str, outputs: dict[str, str], commands: list[str]):
  """One procedure as ``harness`` (a chat harness with at least ``len(commands) + 1`` turns) records it: its own
  loop, prompts and observations, with a scripted policy replying each command then ``done``, in a
  :class:`CorpusShell`. The :class:`~rsi_jax.env.harness.AgentRun`."""
  import time
  from types import SimpleNamespace

  from rsi_jax.env.harness import ScriptedPolicy
  policy = ScriptedPolicy(tokenizer, [reply(c, harness.name) for c in commands], default=done_reply(harness.name))
  harness.policy = policy
  run = harness.run(CorpusShell(outputs), SimpleNamespace(instruction=instruction), time.time() + 3600)
  if run.stop_reason != "done":
    raise ValueError(f"a corpus procedure did not end with done ({run.stop_reason}): env.max_turns "
                     f"{harness.max_turns} < {len(commands) + 1} turns?")
  return run


def shape_words() -> frozenset[str]:
  """The words of the shapes' own text (programs, options, "file", ...) and the folders of :data:`DIRS`: never a
  value, so that a value in a command is always one the instruction gave."""
  texts = [t for s in SHAPES for t in (s.command, *s.phrasings)]
  texts += [t for p in PROCEDURES for t in (p.read, p.output, p.act, *p.phrasings)]
  return _words(texts) | frozenset(DIRS)


def paraphrase_words() -> frozenset[str]:
  """The words of the procedures' paraphrases, never a value of a procedure's draw (:func:`_procedure_values`)."""
  return _words(t.lower() for p in PROCEDURES for t in p.paraphrases)


def _words(texts) -> frozenset[str]:
  """The runs of lowercase letters in ``texts``, slots (``{a}``) left out."""
  return frozenset(w for t in texts for w in re.findall(r"[a-z]+", re.sub(r"\{\w\}", " ", t)))


def _procedure_values(values) -> list[str]:
  """``values`` less the paraphrases' words (those of ``phrasings`` the value pools already leave out)."""
  screened = paraphrase_words()
  return [v for v in values if v not in screened]


def _check_values(values):
  """Refuse corpus values that are the learning check's own (no corpus pair may be one of its tasks)."""
  if set(values) & CHECK_VALUES:
    raise ValueError(f"corpus values shared with the learning check's tasks: {sorted(set(values) & CHECK_VALUES)}")


def _draw(rng: random.Random, values) -> dict:
  words = rng.sample(list(values), 5)
  drawn = dict(zip("abcwv", words))
  drawn["n"] = rng.choice(NUMBERS)
  drawn["d"], drawn["e"] = rng.choice(DIRS), rng.choice(EXTS)
  return drawn


def variant(shape: Shape, rng: random.Random) -> tuple[str, str]:
  """(instruction, command) templates of one draw of ``shape``: a random phrasing; half the time its first
  value's path one folder deeper (``/app/{a}`` -> ``/app/{d}/{a}``, ``d`` one of :data:`DIRS`) and, on its own
  coin, half the time its files' extension another (``.{e}``, one of :data:`EXTS`), the same change in both, so
  that no program is tied to one folder or one extension."""
  instruction, command = rng.choice(shape.phrasings), shape.command
  if "/app/{a}" in command and rng.random() < 0.5:
    instruction, command = (t.replace("/app/{a}", "/app/{d}/{a}") for t in (instruction, command))
  if rng.random() < 0.5:
    instruction, command = (EXTENSION.sub(".{e}", t) for t in (instruction, command))
  return instruction, command


def corpus_digest() -> str:
  """A digest of what the corpus is made of (this module's source: its shapes, procedures and rules), so that
  a phase's stored Q_clean of another corpus is never taken for this one's (``rsi_jax.rsr.corpus.corpus_label``)."""
  from pathlib import Path
  return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]


def pairs(n: int, seed: int, values, *, broken: bool = False, shapes=SHAPES) -> list[tuple[str, str]]:
  """``n`` (instruction, command) pairs, seeded: ``shapes`` in turn (each shape equally often; default all), a
  random phrasing, distinct values drawn from ``values`` (:func:`value_pools`). ``broken``: the command's values
  drawn afresh, independently of the instruction's (the broken variant)."""
  _check_values(values)
  if not shapes:
    raise ValueError("pairs need at least one shape")
  rng = random.Random(f"base-corpus-{seed}")
  wrong = random.Random(f"base-corpus-{seed}-broken")  # its own stream: the broken variant's instructions are kept
  out = []
  for k in range(n):
    shape = shapes[k % len(shapes)]
    said = _draw(rng, values)
    done = _draw(wrong, values) if broken else said
    instruction, command = variant(shape, rng)
    out.append((instruction.format(**said), command.format(**done)))
  return out


def done_reply(harness: str = "json") -> str:
  """The harness's action that ends an episode."""
  return "<done/>" if harness == "xml" else json.dumps({"done": True})


def reply(command: str, harness: str = "json") -> str:
  """The harness's action for a corpus command (as the learning check's scripted Base demonstrations)."""
  if harness == "xml":
    return f"<command>{command}</command>"
  if harness != "json":
    raise ValueError(f"no corpus reply for harness {harness!r} (json, xml)")
  return json.dumps({"command": command, "done": False})
