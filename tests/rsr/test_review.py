"""The review gate q(x, b) and the leakage screen on crafted runbooks and transcripts for shipped tasks."""

import json

import pytest

from rsi_jax.config import REPO_ROOT
from rsi_jax.env.harness import ScriptedPolicy, oracle_commands
from rsi_jax.env.tasks import load_tasks
from rsi_jax.policy import SamplingParams
from rsi_jax.rsr import Review, review, screen_trajectory
from rsi_jax.rsr.review import ModelJudge, task_facts
from rsi_jax.rsr.runbook import load_template, parse_runbook

TASKS = {t.name: t for t in load_tasks(REPO_ROOT / "tasks")}
BACKUP = TASKS["file-ops-backup-archive"]
README_SHA = "c3c183ff63b252974d72040d527f4dd4b3ed5ce604373f8c75f6392f7aec6b08"  # in the task's tests only


def runbook(steps="1. Archive the project without temporary files and caches:\n"
                  "   `cd /app && tar --exclude='*.tmp' --exclude='__pycache__' -czf backup.tar.gz project`",
            checks="- `tar -tzf /app/backup.tar.gz | head` lists members under `project/`.",
            goal="A gzip tar archive of /app/project at /app/backup.tar.gz without .tmp files and caches."):
  parts = []
  for name, body in (("Goal", goal), ("Steps", steps), ("Checks", checks)):
    if body is not None:
      parts.append(f"## {name}\n{body}\n")
  return "\n".join(parts)


def test_clean_runbook_is_accepted_and_review_is_deterministic():
  v = review(BACKUP, runbook())
  assert v == Review(True, (), ())
  assert review(BACKUP, runbook()) == v


LEAKS = {
    "leakage:test_file": runbook(checks="- the checks of test_outputs.py pass."),
    "leakage:verifier_path": runbook(checks="- `cat /logs/verifier/reward.txt` shows 1."),
    "leakage:answer": runbook(checks=f"- `sha256sum` of project/README.md in the archive is {README_SHA}."),
    "leakage:solution": runbook(steps="1. `bash /solution/solve.sh`"),
}


@pytest.mark.parametrize("kind", sorted(LEAKS))
def test_each_leakage_kind_is_rejected_with_its_reason(kind):
  v = review(BACKUP, LEAKS[kind])
  assert not v.accepted
  assert kind in v.reasons, v
  assert all(d for d in v.details) and len(v.details) == len(v.reasons)


def test_verifier_paths_and_solution_names():
  for text in ("`ls /tests`", "read /tests/test.sh first", "`cat /logs/verifier/ctrf.json`"):
    assert "leakage:verifier_path" in review(BACKUP, runbook(checks=f"- {text}")).reasons, text
  assert "leakage:solution" in review(BACKUP, runbook(checks="- do what solve.sh does")).reasons
  # a word that merely contains a private name is not a mention of it
  assert review(BACKUP, runbook(checks="- `ls /app/tests_backup_dir` is not needed; `ls /app`")).accepted


def test_schema_artifact_and_compatibility_rules():
  assert review(BACKUP, runbook(checks=None)).reasons == ("schema",)
  assert "schema" in review(BACKUP, runbook(steps="")).reasons
  assert review(BACKUP, "just run tar").reasons[0] == "schema"
  v = review(BACKUP, runbook(steps="1. `cat /app/project/secret.cfg`\n2. `cd /app && tar -czf backup.tar.gz project`"))
  assert v.reasons == ("artifact",) and "/app/project/secret.cfg" in v.details[0]
  # files of the environment where the Dockerfile copies them, and files an earlier step writes, are fine
  assert review(BACKUP, runbook(steps="1. `cat /app/project/README.md`\n2. `cd /app && ls project > list.txt`\n"
                                      "3. `cat list.txt`\n4. `tar -czf /app/backup.tar.gz -C /app project`")).accepted
  assert review(BACKUP, runbook(steps="1. `vim /app/project/README.md`")).reasons == ("compatibility",)
  assert review(BACKUP, runbook(steps="1. `pip install tarfile-tools`")).reasons == ("compatibility",)
  assert review(BACKUP, runbook(steps="1. `pip install tarfile-tools`"), network=True).accepted
  assert "compatibility" in review(BACKUP, runbook(steps="1. Make the archive somehow.")).reasons


@pytest.mark.parametrize("name", sorted(TASKS))
def test_runbook_repeating_the_agents_commands_is_not_leakage(name):
  """The reference solution's commands, as an agent that found them would write them down, pass review on
  every shipped task (resemblance to the solution is not leakage; naming it is)."""
  task = TASKS[name]
  cmds = oracle_commands(task).replace("#!/bin/bash", "").strip()
  v = review(task, f"## Goal\n{task.instruction.strip().splitlines()[0]}\n\n## Steps\n1. Run:\n```bash\n{cmds}\n"
                   f"```\n\n## Checks\n- `ls -la {task_facts(task).workdir}`\n")
  assert v.accepted, v


def test_answer_literals_are_values_of_the_tests_found_nowhere_public():
  facts = task_facts(BACKUP)
  assert README_SHA in facts.test_literals
  assert "/app/backup.tar.gz" not in facts.test_literals  # named by the instruction: public
  assert "project/README.md" not in facts.test_literals  # an environment file: public
  assert not any(lit.startswith("archive is") for lit in facts.test_literals)  # assertion messages


def test_a_judge_can_only_reject(tokenizer, renderer):
  template = load_template("configs/rsr/judge.md")
  judge = lambda reply: ModelJudge(ScriptedPolicy(tokenizer, [reply]), renderer, template.text,  # noqa: E731
                                   SamplingParams(max_new_tokens=32))
  assert review(BACKUP, runbook(), judge=judge("ACCEPT fine")).accepted
  v = review(BACKUP, runbook(), judge=judge("REJECT it guesses values"))
  assert not v.accepted and v.reasons == ("judge",) and "guesses" in v.details[0]
  # the rules reject: an accepting judge cannot override them (and is not even asked)
  yes = judge("ACCEPT")
  v = review(BACKUP, LEAKS["leakage:answer"], judge=yes)
  assert not v.accepted and "leakage:answer" in v.reasons and yes.policy.calls == []
  # the judge sees only the public instruction and the runbook
  review(BACKUP, runbook(), judge=yes)
  prompt = tokenizer.decode(yes.policy.calls[0])
  assert BACKUP.instruction.strip() in prompt and "test_outputs" not in prompt and README_SHA not in prompt


def msgs(*commands):
  out = []
  for c in commands:
    out += [{"role": "assistant", "content": json.dumps({"command": c, "done": False})},
            {"role": "tool", "content": json.dumps({"exit_code": 0, "timed_out": False, "output": ""})}]
  return out


def test_screen_trajectory():
  clean = msgs("cd /app", "tar --exclude='*.tmp' --exclude='__pycache__' -czf backup.tar.gz project")
  assert screen_trajectory(BACKUP, clean).accepted
  assert screen_trajectory(BACKUP, msgs("ls /tests")).reasons == ("leakage:verifier_path",)
  assert screen_trajectory(BACKUP, msgs("cat /solution/solve.sh")).reasons[0] == "leakage:solution"
  assert screen_trajectory(BACKUP, msgs("find / -name test_outputs.py")).reasons == ("leakage:test_file",)
  assert screen_trajectory(BACKUP, msgs("cat /logs/verifier/ctrf.json")).reasons == ("leakage:verifier_path",)
  # observations are what the world printed, not what the agent did
  printed = [{"role": "tool", "content": "see /tests and solve.sh"}]
  assert screen_trajectory(BACKUP, msgs("ls") + printed).accepted


def test_parse_runbook_and_templates():
  assert parse_runbook("<think>hmm</think>\n```markdown\n## Goal\nx\n```") == "## Goal\nx"
  plan = load_template("configs/rsr/plan.md")
  assert plan.version == "1" and len(plan.digest) == 12 and "<!--" not in plan.text
  text = plan.render(instruction="INSTR", transcript="$ ls")
  assert "INSTR" in text and "$ ls" in text and "${" not in text
  with pytest.raises(KeyError, match="transcript"):
    plan.render(instruction="x")
  with pytest.raises(FileNotFoundError, match="nope.md"):
    load_template("configs/rsr/nope.md")
