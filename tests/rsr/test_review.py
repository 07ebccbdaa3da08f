"""The review gate q(x, b) and the leakage screen on crafted runbooks and transcripts for shipped tasks."""

import json

import pytest

from rsi_jax.config import REPO_ROOT
from rsi_jax.env.harness import ScriptedPolicy, oracle_commands
from rsi_jax.env.tasks import load_tasks
from rsi_jax.policy import SamplingParams
from rsi_jax.rsr import Review, review, screen_trajectory
from rsi_jax.rsr.facts import task_facts
from rsi_jax.rsr.review import ModelJudge
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
  assert review(BACKUP, runbook(checks="- a folder named tests_backup_dir is not a mention; `ls /app`")).accepted


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
  judge = lambda reply: ModelJudge(ScriptedPolicy(tokenizer, [reply]), renderer, template,  # noqa: E731
                                   SamplingParams(max_new_tokens=32))
  assert review(BACKUP, runbook(), judge=judge("ACCEPT fine")).accepted
  v = review(BACKUP, runbook(), judge=judge("REJECT it guesses values"))
  assert not v.accepted and v.reasons == ("judge",) and "guesses" in v.details[0]
  # the rules reject: an accepting judge cannot override them (and is not even asked)
  yes = judge("ACCEPT")
  v = review(BACKUP, LEAKS["leakage:answer"], judge=yes)
  assert not v.accepted and "leakage:answer" in v.reasons and yes.policy.calls == []
  # the judge sees the public instruction and the runbook, rendered into its template, and nothing else
  review(BACKUP, runbook(), judge=yes)
  prompt = tokenizer.decode(yes.policy.calls[0])
  assert f"Task:\n{BACKUP.instruction.strip()}\n" in prompt and f"Runbook:\n{runbook().strip()}\n" in prompt
  assert "${" not in prompt and "test_outputs" not in prompt and README_SHA not in prompt


AGENT_STYLE = {  # steps and checks an agent writes from what it ran and saw: none of them is leakage
    "text-processing-error-summary": ["`grep -oE '\\[[a-z]+\\]' /app/logs/app.log | sort | uniq -c`",
                                      "the count of each level is printed"],
    "shell-scripting-retry": ["`/app/retry.sh 3 0 /app/flaky.sh` prints `attempt 1/3`",
                              "the count of attempts is at most 3"],
    "python-fix-csv-stats": ["`printf 'a,b\\n1,2\\n' > /tmp/d.csv && python3 /app/stats.py /tmp/d.csv b` prints "
                             "no Traceback",
                             "`printf 'x\\n' | python3` runs without error"],
    "file-ops-sort-by-extension": ["json files end up in `/app/sorted/json`", "`ls /app/sorted`"],
    "text-processing-access-log": ["`grep -v curl /app/logs/access.log | wc -l`",
                                   "`sed -n '/start/,/end/p' /app/logs/access.log | head`"],
}


@pytest.mark.parametrize("name", sorted(AGENT_STYLE))
def test_agent_style_checks_are_not_rejected(name):
  task = TASKS[name]
  step, check = AGENT_STYLE[name]
  v = review(task, runbook(steps=f"1. {step}\n2. Run:\n```bash\npython3 - <<'PY'\ntop = sorted([3, 1])\n"
                                 f"print(top)\nPY\n```", checks=f"- {check}"))
  assert v.accepted, v


def test_relative_and_globbed_private_paths_are_leakage():
  for cmd in ("cd / && ls tests", "cd /app && cat ../tests/test.sh", "ls /te*", "cat /t*/test_outputs.py",
              "cd /logs && cat verifier/reward.txt", "cd / && cat solution/solve.sh"):
    v = review(BACKUP, runbook(steps=f"1. `{cmd}`\n2. `cd /app && tar -czf backup.tar.gz project`"))
    assert any(r.startswith("leakage:") for r in v.reasons), (cmd, v)
    assert not screen_trajectory(BACKUP, msgs(*cmd.split(" && "))).accepted, cmd
  # the agent's own scripts may have generic names
  own = msgs("printf 'echo hi' > /tmp/test.sh && bash /tmp/test.sh")
  assert screen_trajectory(BACKUP, own).accepted
  assert review(BACKUP, runbook(steps="1. `printf 'tar -czf /app/backup.tar.gz -C /app project' > /tmp/solve.sh`\n"
                                      "2. `bash /tmp/solve.sh`")).accepted


def test_markdown_variants():
  body = ("# 1. Goal:\nBack up.\n\n### Steps (commands)\n~~~ bash\n# a comment, not a heading\n"
          "cd /app && tar -czf backup.tar.gz project\n~~~\n\n## Checks\n- `ls /app`\n")
  assert review(BACKUP, body).accepted
  from rsi_jax.env.dockerfiles import dockerfile_layout
  assert dockerfile_layout('WORKDIR /srv\nCOPY ["src", "/srv/src"]\nCOPY --chown=1:1 a.txt b/\n') == (
      "/srv", [("src", "/srv/src"), ("a.txt", "/srv/b/")])


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


BARE_STEPS = "1. cd /app\n2. tar --exclude='*.tmp' --exclude='__pycache__' -czf backup.tar.gz project"
SPAN_STEPS = "1. `cd /app`\n2. `tar --exclude='*.tmp' --exclude='__pycache__' -czf backup.tar.gz project`"


def test_commands_given_as_bare_lines_count_like_code():
  # the runbook that was rejected with "no step gives a shell command": its steps are bare numbered lines
  assert review(BACKUP, runbook(steps=BARE_STEPS)).accepted
  assert review(BACKUP, runbook(steps=SPAN_STEPS)).accepted
  for steps in ("- cd /app\n- tar -czf backup.tar.gz project",
                "* $ cd /app && tar -czf backup.tar.gz project",
                "1. Archive the project:\n   tar -czf /app/backup.tar.gz -C /app project",
                "1) LC_ALL=C tar -czf /app/backup.tar.gz -C /app project"):
    assert review(BACKUP, runbook(steps=steps)).accepted, steps
  # prose that names no command is not a command, whatever word it starts with
  for prose in ("1. Look at the files", "1. Make the archive somehow.", "1. find the project and archive it",
                "1. tar the project folder into an archive", "- Archive the project:", "1. cat it all together"):
    v = review(BACKUP, runbook(steps=prose))
    assert v.reasons == ("compatibility",) and v.details == ("no step gives a shell command",), (prose, v)


def test_every_rule_sees_bare_line_commands():
  v = review(BACKUP, runbook(steps="1. cat /app/project/secret.cfg\n2. cd /app && tar -czf backup.tar.gz project"))
  assert v.reasons == ("artifact",) and "/app/project/secret.cfg" in v.details[0]
  v = review(BACKUP, runbook(steps="1. vim /app/project/README.md"))
  assert v.reasons == ("compatibility",) and "interactive" in v.details[0]
  v = review(BACKUP, runbook(steps="1. pip install tarfile-tools"))
  assert v.reasons == ("compatibility",) and "network" in v.details[0]
  # a file an earlier bare step writes may be read by a later one
  assert review(BACKUP, runbook(steps="1. cd /app\n2. ls project > list.txt\n3. cat list.txt\n"
                                      "4. tar -czf /app/backup.tar.gz -C /app project")).accepted


def test_bare_line_commands_that_reach_the_tests_are_leakage_like_code_spans():
  for cmds in (["cd /", "ls tests"], ["ls /te*"], ["cd /logs", "cat verifier/reward.txt"],
               ["cd /app", "cat ../solution/solve.sh"], ["cat /t*/test_outputs.py"]):
    tail = "\n9. cd /app && tar -czf backup.tar.gz project"
    bare = review(BACKUP, runbook(steps="\n".join(f"{i + 1}. {c}" for i, c in enumerate(cmds)) + tail))
    span = review(BACKUP, runbook(steps="\n".join(f"{i + 1}. `{c}`" for i, c in enumerate(cmds)) + tail))
    assert any(r.startswith("leakage:") for r in bare.reasons), (cmds, bare)
    assert bare == span, cmds
  # a relative path is leakage only as a command: as prose it names nothing
  v = review(BACKUP, runbook(steps="1. cd /\n2. ls tests"))
  assert v.reasons == ("leakage:verifier_path",) and "reaches /tests" in v.details[0]


def test_the_tasks_own_programs_are_commands():
  retry = TASKS["shell-scripting-retry"]
  facts = task_facts(retry)
  assert {"retry.sh", "flaky.sh"} <= facts.programs and "attempt" not in facts.programs  # a value, not a program
  steps = "1. chmod +x /app/retry.sh\n2. /app/retry.sh 3 0 /app/flaky.sh\n"
  v = review(retry, runbook(steps=steps, checks="- /app/retry.sh 2 0 true", goal="A retry script."))
  assert v.accepted, v
  from rsi_jax.rsr.shellwords import bare_command
  assert bare_command("- mytool --check data.csv") is None
  assert bare_command("- mytool --check data.csv", {"mytool"}) == "mytool --check data.csv"
  assert bare_command("- ./build.sh --fast") == "./build.sh --fast"
