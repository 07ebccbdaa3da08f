"""DockerSandbox against a real daemon: persistent shell, hard timeouts, output cap, lockdown, file copy,
faults (killed container, daemon error on create), teardown on error / SIGINT / SIGTERM, the reaper."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import docker.errors

import pytest

from rsi_jax.env.reaper import LABEL_EPISODE, LABEL_HOST, LABEL_PID, LABEL_RUN, LABEL_TASK, reap_orphans
from rsi_jax.env.sandbox import CONTAINER_DIED, CREATE_FAILED, DockerSandbox, SandboxError

from .conftest import REPO

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def box(docker_client, run_id):
  with DockerSandbox(docker_client, "rsi-base", run_id=run_id, task_name="sandbox-test", cpus=1.0,
                     memory_bytes=256 << 20, pids_limit=128, output_cap_bytes=1000,
                     command_timeout_s=20) as b:
    yield b


def _gone(client, cid):
  try:
    client.containers.get(cid)
    return False
  except docker.errors.NotFound:
    return True


def test_scripts_daemon_and_base_image(docker_client):
  """The daemon script is idempotent and quiet when a daemon answers; a real container's output comes back;
  the base image has python3 and pytest and writes a CTRF report from a real pytest --ctrf run."""
  up = subprocess.run(["bash", str(REPO / "scripts" / "docker_up.sh")], capture_output=True, text=True)
  assert up.returncode == 0 and up.stdout == "" and up.stderr == ""
  base = subprocess.run(["bash", str(REPO / "scripts" / "build_base_image.sh")], capture_output=True, text=True)
  assert base.returncode == 0, base.stderr
  again = subprocess.run(["bash", str(REPO / "scripts" / "build_base_image.sh")], capture_output=True, text=True)
  assert again.returncode == 0 and again.stderr == "", again.stderr  # cached by its content tag
  script = textwrap.dedent("""\
      cd /tmp && printf 'def test_ok():\\n  assert 1\\n\\ndef test_bad():\\n  assert 0\\n' > test_x.py
      python3 --version; python3 -m pytest --version
      python3 -m pytest -q -p no:cacheprovider --ctrf /tmp/ctrf.json test_x.py > /dev/null
      cat /tmp/ctrf.json""")
  run = subprocess.run(["docker", "run", "--rm", "--network", "none", "rsi-base", "bash", "-c", script],
                       capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr
  assert run.stdout.startswith("Python 3.") and "pytest" in run.stdout
  from rsi_jax.rl.ctrf import parse_ctrf
  report = parse_ctrf(run.stdout[run.stdout.index("{"):])
  assert report.valid and report.passed == 1 and report.failed == 1 and report.total == 2
  # the family image upstream Python 3.13 images map onto (built by scripts/test.sh): its own Python, and
  # `python` as in python:* images
  run = subprocess.run(["docker", "run", "--rm", "--network", "none", "rsi-base-trixie", "bash", "-c",
                        "python --version; python3 -m pytest --version; grep -o 'suite=[a-z]*' /etc/rsi-base"],
                       capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr
  assert run.stdout.startswith("Python 3.13.") and "pytest 9.2.0" in run.stdout + run.stderr
  assert run.stdout.strip().endswith("suite=trixie")


def test_persistent_shell_state(box):
  assert box.run("cd /tmp && mkdir -p work && cd work && export GREETING='hi there' && LOCAL=1").exit_code == 0
  r = box.run('pwd; echo "$GREETING"; echo "local=${LOCAL:-unset}"')
  assert r.output == "/tmp/work\nhi there\nlocal=unset\n" and r.exit_code == 0
  r = box.run("echo out; echo err >&2; exit 7")
  assert r.output == "out\nerr\n" and r.exit_code == 7 and not r.timed_out
  assert box.run("pwd").output == "/tmp/work\n"  # an `exit` does not lose the state
  r = box.run("echo 'unbalanced")
  assert r.exit_code == 2 and "unexpected EOF" in r.output
  assert box.run("cat").exit_code == 0  # stdin is /dev/null: a reader cannot hang the shell


def test_a_lost_output_stream_is_read_back_from_the_container(box, monkeypatch):
  """Docker can lose a short exec's output stream (moby/moby#27289; once on a loaded machine here ``pwd`` came
  back empty). That loss cannot be provoked on demand, so the exec's reply is emptied here (a mock of the
  fault only: the command runs for real): the result is read back from the container, output and exit code."""
  from rsi_jax.env.sandbox_shell import SHELL_SCRIPT
  real = box.container.exec_run
  lost = []

  def losing(cmd, **kw):
    res = real(cmd, **kw)
    if SHELL_SCRIPT in cmd:
      lost.append(res.output)
      return type(res)(res.exit_code, b"")
    return res

  monkeypatch.setattr(box.container, "exec_run", losing)
  r = box.run("cd /tmp; echo one; echo two >&2; exit 3")
  assert (r.output, r.exit_code, r.timed_out) == ("one\ntwo\n", 3, False)
  r = box.run("pwd")
  assert (r.output, r.exit_code) == ("/tmp\n", 0)
  assert lost == [b"one\ntwo\n\x1eRSI:3\x1e", b"/tmp\n\x1eRSI:0\x1e"]  # what Docker would have delivered
  monkeypatch.undo()
  # earlier commands' results are gone once the next command starts, and a killed command is still killed
  assert box.run("ls /tmp/.rsi_shell | grep -c result || true").output == "0\n"
  r = box.run("kill -KILL $$")
  assert r.exit_code == 137 and not r.timed_out


def test_a_trusted_command_whose_output_stream_is_lost_is_read_back_from_the_container(box, monkeypatch):
  """The verifier's and the tamper check's trusted commands are read by their output (interpreters' site
  folders, programs put on the PATH). Docker loses a short exec's output stream on a loaded machine
  (moby/moby#27289; 3 of 80 oracle episodes with the CPUs busy): the result kept in the container is read
  back (a plain copy, not a stream). Where it cannot be, the loss is an infrastructure error, never "no
  output". The commands run for real; only Docker's delivery of their output is dropped (a stand-in: the
  daemon's race cannot be provoked on demand)."""
  from rsi_jax.env.sandbox import DOCKER_ERROR
  from rsi_jax.env.sandbox_shell import RAW_SCRIPT
  assert box.exec_raw(["/bin/echo", "site"], timeout_s=10).output == "site\n"  # the end mark is not output
  assert box.exec_raw(["/bin/bash", "-c", "echo no; exit 4"], timeout_s=10).exit_code == 4
  real = box.container.exec_run
  lost = []

  def losing(cmd, **kw):
    res = real(cmd, **kw)
    if RAW_SCRIPT not in cmd:
      return res
    lost.append(res.output)
    return type(res)(res.exit_code, b"")

  monkeypatch.setattr(box.container, "exec_run", losing)
  r = box.exec_raw(["/bin/bash", "-c", "echo site; echo err >&2; exit 3"], timeout_s=10)
  assert (r.output, r.exit_code, r.timed_out) == ("site\nerr\n", 3, False)
  assert lost == [b"site\nerr\n\x1eRSI:3\x1e"]  # what Docker would have delivered
  # a kill -1 (the verifier's first step) spares the script, and its kept result is read back too
  assert box.exec_raw(["kill", "-KILL", "-1"], timeout_s=10).exit_code == 0
  with pytest.raises(SandboxError) as e:  # nothing kept to read back: the command removed it
    box.exec_raw(["/bin/bash", "-c", "rm -f /tmp/.rsi_raw.*; echo site"], timeout_s=10)
  assert e.value.kind == DOCKER_ERROR and "lost its output stream" in str(e.value)
  monkeypatch.undo()
  # the host removes the kept results it has read, with the next trusted command
  assert box.exec_raw(["/bin/bash", "-c", "ls -a /tmp | grep -c rsi_raw"], timeout_s=10).output == "1\n"
  # removing its kept copy does not cost a command its output when the stream arrives
  r = box.exec_raw(["/bin/bash", "-c", "rm -f /tmp/.rsi_raw.*; echo still"], timeout_s=10)
  assert (r.output, r.exit_code) == ("still\n", 0)
  # nor does a /tmp it cannot write (an agent replaced it with a file: the stream only)
  assert box.exec_raw(["/bin/bash", "-c", "mv /tmp /tmp.away && touch /tmp"], timeout_s=10).exit_code == 0
  try:
    r = box.exec_raw(["/bin/bash", "-c", "echo fine; echo err >&2"], timeout_s=10)
    assert (r.output, r.exit_code) == ("fine\nerr\n", 0)
  finally:
    box.exec_raw(["/bin/bash", "-c", "rm /tmp && mv /tmp.away /tmp"], timeout_s=10)
  assert "RSI_RAW" not in box.exec_raw(["/usr/bin/env"], timeout_s=10).output


def test_a_killed_trusted_command_keeps_what_it_wrote(box):
  """A command killed at its timeout has no end mark and is not an error; what it printed before is kept."""
  r = box.exec_raw(["/bin/bash", "-c", "echo started; exec sleep 30"], timeout_s=1)
  assert (r.output, r.exit_code, r.timed_out) == ("started\n", 137, True)


def test_a_trusted_commands_output_is_one_stream_and_ends_with_it(box):
  """Docker delivers stdout and stderr as two streams in no fixed order: a verifier whose last stderr line came
  after the end mark was read as a broken exit code (an infrastructure failure in place of the verifier's own
  "command not found"). One command's output is one stream in its order; a child it leaves behind neither
  holds the exec open nor breaks the exit code."""
  r = box.exec_raw(["/bin/bash", "-c", "echo one; echo two >&2; echo three"], timeout_s=10)
  assert r.output == "one\ntwo\nthree\n"
  t0 = time.time()
  r = box.exec_raw(["/bin/bash", "-c", "(sleep 3; echo late >&2) & echo early; nocommand; exit 127"], timeout_s=10)
  assert r.exit_code == 127 and r.output.startswith("early\n") and "nocommand: command not found" in r.output
  assert time.time() - t0 < 2.5


def test_timeout_hard_kill_and_recovery(box):
  box.run("cd /tmp && export KEEP=yes")
  t0 = time.time()
  r = box.run("echo started; (sleep 300 &); sleep 300 & sleep 300", timeout_s=2)
  assert r.timed_out and r.exit_code == 124 and time.time() - t0 < 10
  assert r.output.startswith("started\n") and "timed out after 2s" in r.output
  # the whole process group is gone, the shell recovered with its state
  left = [x.split(" ", 1)[1] for x in box.run("pgrep -a -x sleep").output.splitlines()]
  assert "sleep 300" not in left and "/usr/bin/sleep 86400" in left  # PID 1's own sleep stays
  r = box.run('pwd; echo "$KEEP"')
  assert r.output == "/tmp\nyes\n" and r.exit_code == 0


def test_killing_the_watchdog_does_not_escape_the_timeout(box):
  """The agent is root beside its watchdog and can kill it; the host-side backstop still ends the command
  (within the timeout plus the backstop grace) and reports a timeout, and the shell keeps working."""
  from rsi_jax.env.sandbox import BACKSTOP_GRACE_S
  t0 = time.time()
  r = box.run("pkill -KILL -f rsi_shell/timeout; echo watchdog-gone; sleep 120", timeout_s=2)
  assert r.timed_out and r.exit_code == 124 and "watchdog-gone" in r.output
  assert time.time() - t0 < 2 + BACKSTOP_GRACE_S + 8
  assert box.run("echo alive").output == "alive\n"


def test_background_job_does_not_block(box):
  t0 = time.time()
  r = box.run("sleep 100 > /dev/null 2>&1 & echo launched", timeout_s=15)
  assert r.output == "launched\n" and not r.timed_out and time.time() - t0 < 5


def test_output_cap_elides_the_middle(box):
  r = box.run("python3 -c \"import sys; sys.stdout.write('A' * 3000 + 'B' * 3000)\"")
  head, sep, tail = r.output.partition("\n[... 5000 bytes of output elided ...]\n")
  assert sep and head == "A" * 500 and tail == "B" * 500


def test_lockdown_and_labels(box, run_id):
  box.container.reload()
  hc, labels = box.container.attrs["HostConfig"], box.container.labels
  assert hc["NetworkMode"] == "none" and sorted(hc["CapDrop"]) == ["AUDIT_WRITE", "MKNOD", "NET_RAW", "SETFCAP"]
  assert hc["SecurityOpt"] == ["no-new-privileges"]  # and Docker's default seccomp profile, in force:
  assert "Seccomp:\t2" in box.run("grep Seccomp: /proc/self/status").output
  assert "NoNewPrivs:\t1" in box.run("grep NoNewPrivs: /proc/self/status").output
  assert hc["NanoCpus"] == 10**9 and hc["Memory"] == 256 << 20 and hc["PidsLimit"] == 128
  assert labels[LABEL_RUN] == run_id and labels[LABEL_TASK] == "sandbox-test" and labels[LABEL_EPISODE]
  r = box.run("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)\"")
  assert r.exit_code != 0 and "unreachable" in r.output.lower()
  assert box.run("cat /sys/class/net/*/operstate 2>/dev/null; ls /sys/class/net").output.split() in (
      ["unknown", "lo"], ["lo"], ["down", "lo"])
  assert box.run("mknod /tmp/dev c 1 3").exit_code != 0  # CAP_MKNOD is dropped
  raw = box.run("python3 -c \"import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)\"")
  assert raw.exit_code != 0 and "PermissionError" in raw.output  # CAP_NET_RAW is dropped


def test_ordinary_root_work_inside_the_sandbox(box):
  """What task setups and solutions do as root: change owners, add users, unpack archives keeping owners,
  drop to an unprivileged user."""
  r = box.run("set -e; mkdir -p /tmp/own && touch /tmp/own/f && chown nobody:nogroup /tmp/own/f && "
              "stat -c %U /tmp/own/f; useradd -m builder && id -u builder; "
              "tar -C /tmp -cf /tmp/a.tar own && mkdir /tmp/x && tar -C /tmp/x -xf /tmp/a.tar && "
              "stat -c %U /tmp/x/own/f; su -s /bin/sh nobody -c 'id -un'; chmod 000 /tmp/own/f && cat /tmp/own/f "
              "&& echo root-reads")
  assert r.exit_code == 0, r.output
  lines = r.output.split()
  assert lines[0] == "nobody" and lines[1].isdigit() and lines[2:] == ["nobody", "nobody", "root-reads"]


def test_agent_cannot_end_its_container(box):
  r = box.run("kill -TERM 1; kill -INT 1; kill -KILL 1; echo still here")
  assert r.output.endswith("still here\n")
  assert box.is_running() and box.run("echo alive").output == "alive\n"


def test_file_copy_in_and_out(box, tmp_path):
  box.put_files({"/data/in/a.txt": "alpha\n", "/data/in/b.bin": bytes(range(256))}, mode=0o600)
  assert box.get_file("/data/in/b.bin") == bytes(range(256))
  assert box.run("stat -c %a /data/in/a.txt").output == "600\n"
  (tmp_path / "d" / "sub").mkdir(parents=True)
  (tmp_path / "d" / "sub" / "x.sh").write_text("echo x\n")
  (tmp_path / "d" / "sub" / "x.sh").chmod(0o755)
  box.put_dir(tmp_path / "d", "/copied")
  assert box.run("/copied/sub/x.sh").output == "x\n"
  assert box.get_file("/does/not/exist") is None
  assert box.get_file("/data/in") is None  # a folder is not a file


def test_killed_container_is_container_died(docker_client, run_id):
  b = DockerSandbox(docker_client, "rsi-base", run_id=run_id, task_name="killed").start()
  try:
    killer = threading.Timer(1.0, lambda: docker_client.containers.get(b.container.id).kill())
    killer.start()
    with pytest.raises(SandboxError) as e:
      b.run("sleep 30", timeout_s=60)
    assert e.value.kind == CONTAINER_DIED
  finally:
    b.close()
  assert _gone(docker_client, b.container.id)


def test_daemon_error_on_create_is_create_failed(docker_client, run_id):
  # A real daemon-side rejection: Docker refuses memory limits below 6 MB.
  b = DockerSandbox(docker_client, "rsi-base", run_id=run_id, task_name="bad-create", memory_bytes=1 << 20)
  with pytest.raises(SandboxError) as e:
    b.start()
  assert e.value.kind == CREATE_FAILED and "memory" in str(e.value).lower()
  assert not docker_client.containers.list(all=True, filters={"label": f"{LABEL_EPISODE}={b.episode_id}"})


def test_teardown_on_error(docker_client, run_id):
  with pytest.raises(ZeroDivisionError):
    with DockerSandbox(docker_client, "rsi-base", run_id=run_id, task_name="error") as b:
      cid = b.container.id
      1 / 0
  assert _gone(docker_client, cid)


_CHILD = """
import sys, time
from rsi_jax.env.reaper import install_signal_handlers
from rsi_jax.env.sandbox import DockerSandbox, docker_client
install_signal_handlers()
with DockerSandbox(docker_client(), "rsi-base", run_id=sys.argv[1], task_name="signal") as b:
  print(b.container.id, flush=True)
  b.run("sleep 60", timeout_s=120)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_teardown_on_signal(docker_client, run_id, sig):
  p = subprocess.Popen([sys.executable, "-c", _CHILD, run_id], stdout=subprocess.PIPE, text=True, cwd=REPO)
  cid = p.stdout.readline().strip()
  assert cid, "child did not start a sandbox"
  time.sleep(0.5)
  p.send_signal(sig)
  p.wait(timeout=60)
  assert _gone(docker_client, cid)


def test_reaper_removes_containers_of_dead_runs(docker_client, run_id):
  dead = subprocess.Popen(["true"])
  dead.wait()
  labels = {LABEL_RUN: run_id, LABEL_HOST: socket.gethostname()}
  orphan = docker_client.containers.run("rsi-base", ["sleep", "60"], detach=True, network_mode="none",
                                        labels={**labels, LABEL_PID: str(dead.pid)})
  alive = docker_client.containers.run("rsi-base", ["sleep", "60"], detach=True, network_mode="none",
                                       labels={**labels, LABEL_PID: str(os.getpid())})
  try:
    assert reap_orphans(docker_client) >= 1
    assert _gone(docker_client, orphan.id) and not _gone(docker_client, alive.id)
  finally:
    for c in (orphan, alive):
      try:
        c.remove(force=True)
      except docker.errors.NotFound:
        pass


def test_reaper_tolerates_a_container_removed_while_it_lists(docker_client, run_id):
  """Another run on the host removes one of its containers between the reaper's listing and its look at that
  container (seen when two runs share a daemon): the reaper carries on. The removal is real; only its
  timing is arranged, by removing the container just before the client inspects it."""
  dead = subprocess.Popen(["true"])
  dead.wait()
  labels = {LABEL_RUN: run_id, LABEL_HOST: socket.gethostname(), LABEL_PID: str(dead.pid)}
  first, second = (docker_client.containers.run("rsi-base", ["sleep", "60"], detach=True, network_mode="none",
                                                labels=labels) for _ in range(2))
  inspect = docker_client.api.inspect_container
  removed = []

  def remove_then_inspect(cid, *a, **k):
    if not removed and cid in (first.id, second.id):
      docker_client.api.remove_container(cid, force=True)  # the other run's cleanup, just in time
      removed.append(cid)
    return inspect(cid, *a, **k)

  docker_client.api.inspect_container = remove_then_inspect
  try:
    assert reap_orphans(docker_client) >= 1
    assert removed and _gone(docker_client, first.id) and _gone(docker_client, second.id)
  finally:
    docker_client.api.inspect_container = inspect
    for c in (first, second):
      try:
        c.remove(force=True)
      except docker.errors.NotFound:
        pass


def test_commands_that_set_errexit_keep_their_result_under_load(box):
  """A command that turns on `set -euo pipefail` (as many solution scripts do) and ends at once: the shell's
  own bookkeeping after it must not die with it (a race with the watchdog's start under CPU load made
  about one in seven such commands come back as 'killed', exit 137, with the output lost)."""
  import subprocess
  hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(2)]  # killed below, itself
  try:
    results = [box.run("set -euo pipefail\necho ok") for _ in range(30)]
  finally:
    for h in hogs:
      h.kill()
      h.wait()
  assert [(r.exit_code, r.output) for r in results] == [(0, "ok\n")] * 30
  # a failing command under errexit still reports its own status and output
  r = box.run("set -e\necho before\nfalse\necho after")
  assert (r.exit_code, r.output) == (1, "before\n")


# ------------------------------------------------------------------------------------------ task images


def _harbor(tmp_path, dockerfile: str, name: str = "build-check"):
  """A Harbor task folder (the harbor-greeting fixture) with its own Dockerfile, loaded."""
  import shutil

  from rsi_jax.env.tasks import load_task

  from .conftest import FIXTURES
  d = tmp_path / name
  shutil.copytree(FIXTURES / "harbor-greeting", d)
  (d / "environment" / "Dockerfile").write_text(dockerfile)
  return load_task(d)


def test_context_links_are_copied_as_links_and_outside_ones_refused(tmp_path, docker_client):
  """A link inside the build context (to a file, to a folder) reaches the image as that link, usable; one
  that leaves the context (absolute, or out through `..`) refuses the build naming the link and its target,
  and the file behind it is never read: not into an image, not into the image tag."""
  import hashlib

  from rsi_jax.env.images import build_task_image, task_image_tag
  from rsi_jax.env.sandbox import BUILD_FAILED
  t = _harbor(tmp_path, "FROM rsi-base\nWORKDIR /app\nCOPY project /app/project\n"
              "RUN cat /app/project/a-link.txt /app/project/data-link/b.txt > /app/seen.txt\n")
  project = t.context_dir / "project"
  (project / "data").mkdir(parents=True)
  (project / "data" / "a.txt").write_text("alpha\n")
  (project / "data" / "b.txt").write_text("alpha\n")
  (project / "a-link.txt").symlink_to("data/a.txt")
  (project / "data-link").symlink_to("data")
  tag = build_task_image(docker_client, t)
  out = docker_client.containers.run(tag, ["bash", "-c", "cat /app/seen.txt; readlink /app/project/a-link.txt "
                                           "/app/project/data-link"], remove=True, network_mode="none")
  assert out.decode() == "alpha\nalpha\ndata/a.txt\ndata\n"
  (project / "a-link.txt").unlink()
  (project / "a-link.txt").symlink_to("data/b.txt")  # the same content behind another target: another image
  assert task_image_tag(docker_client, t, {})[0] != tag
  secret = tmp_path / "host-secret.txt"
  secret.write_text("host secret 1\n")
  for target in (str(secret), "../../../host-secret.txt"):
    (project / "secret").unlink(missing_ok=True)
    (project / "secret").symlink_to(target)
    before = task_image_tag(docker_client, t, {})[0]
    secret.write_text(f"host secret {target}\n")
    assert task_image_tag(docker_client, t, {})[0] == before  # the tag never read the file behind the link
    with pytest.raises(SandboxError) as e:
      build_task_image(docker_client, t)
    assert e.value.kind == BUILD_FAILED
    assert f"{project / 'secret'} is a link to {target}, which leaves the build context" in str(e.value)
    with pytest.raises(docker.errors.ImageNotFound):
      docker_client.images.get(before)
  digest = hashlib.sha256(secret.read_bytes()).hexdigest()
  for img in docker_client.images.list(filters={"label": f"{LABEL_TASK}={t.name}"}):  # no image holds it
    sums = docker_client.containers.run(img.id, ["bash", "-c", "find /app -type f -exec sha256sum {} +"],
                                        remove=True, network_mode="none").decode()
    assert digest not in sums
  docker_client.images.remove(tag, force=True)


def test_dockerfile_parse_error_names_the_tasks_own_line(tmp_path, docker_client):
  """The build reads a rewritten Dockerfile (the build CA's lines after each FROM, a header); a parse error is
  reported at the task's own Dockerfile and line."""
  from rsi_jax.env.images import build_task_image
  from rsi_jax.env.sandbox import BUILD_FAILED
  ca = tmp_path / "ca.pem"
  ca.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
  t = _harbor(tmp_path, "FROM rsi-base AS base\nRUN echo one \\\n  && echo two\nFROM base\nWORKDIR /app\n"
              "RUNN echo typo\n")
  with pytest.raises(SandboxError) as e:
    build_task_image(docker_client, t, ca_bundle=str(ca))
  assert e.value.kind == BUILD_FAILED
  assert str(e.value) == (f"{BUILD_FAILED}: build-check: {t.dockerfile} line 6: Dockerfile parse error: "
                          f"unknown instruction: RUNN")


def test_failed_build_says_why(tmp_path, docker_client):
  """A real build fails in a step whose output is long and full of terminal codes (a download's progress
  meter, retries): the reason names the task's own Dockerfile line and keeps the cause ("Could not resolve
  host"), without escape codes or progress redraws, within a bounded length; a second try is answered from
  the record of the first."""
  from rsi_jax.env.images import build_task_image
  from rsi_jax.env.sandbox import BUILD_FAILED
  ca = tmp_path / "ca.pem"
  ca.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
  t = _harbor(tmp_path, "FROM rsi-base\nWORKDIR /app\nRUN for i in $(seq 1 400); do echo \"Unpacking part $i\"; "
              "done \\\n && printf '\\033[1;32mfetching\\033[0m\\n' \\\n"
              " && curl -L --retry 2 --retry-all-errors -o /tmp/tool.tgz http://downloads.example.invalid/tool.tgz"
              " \\\n && tar xzf /tmp/tool.tgz\n")
  with pytest.raises(SandboxError) as e:
    build_task_image(docker_client, t, ca_bundle=str(ca))
  msg = str(e.value)
  assert e.value.kind == BUILD_FAILED and "\x1b" not in msg and "\r" not in msg
  assert len(msg) <= 2100, len(msg)  # the step printed over 8,000 characters
  first = msg.splitlines()[0]
  assert f"build-check: image build failed at {t.dockerfile} line 3 (RUN for i in" in first, first
  assert first.endswith("curl: (6) Could not resolve host: downloads.example.invalid"), first
  assert "exited with status 6" in msg.splitlines()[-1]
  with pytest.raises(SandboxError) as again:
    build_task_image(docker_client, t, ca_bundle=str(ca))
  assert str(again.value) == msg + " (cached: the same build failed earlier in this run)"


@pytest.mark.docker
def test_failed_build_names_a_host_an_earlier_step_could_not_reach(tmp_path, docker_client):
  """``curl -sSf URL | sh`` without pipefail "succeeds" offline; the next step fails for want of the tool it
  fetched (``rustc: not found``). The reason says which host the earlier step could not reach."""
  from rsi_jax.env.images import build_task_image
  from rsi_jax.env.sandbox import BUILD_FAILED
  nonce = uuid.uuid4().hex  # a step Docker's build cache has not seen (a cached step shows no output)
  t = _harbor(tmp_path, f"FROM rsi-base\nRUN echo {nonce} && curl -sSf http://sh.example.invalid/install | sh\n"
              "RUN rsi-tool-it-installed --version\n")
  with pytest.raises(SandboxError) as e:
    build_task_image(docker_client, t, network="none")
  msg = str(e.value)
  assert e.value.kind == BUILD_FAILED and "rsi-tool-it-installed: not found" in msg.splitlines()[0], msg
  assert "an earlier step could not reach a host: curl: (6) Could not resolve host: sh.example.invalid" in msg, msg


def test_disk_measure_is_the_daemons_and_a_runaway_writer_is_stopped_during_its_command(docker_client, run_id):
  """The writable layer is measured here (its changed files), equal to the daemon's ``docker ps --size``; a
  command that writes far past the limit and would then run on is stopped within a few seconds of crossing it,
  not when it ends (the check after each command alone found it only then)."""
  from rsi_jax.env.sandbox import DISK_LIMIT
  with DockerSandbox(docker_client, "rsi-base", run_id=run_id, task_name="disk",
                     disk_limit_bytes=20 << 20, command_timeout_s=120) as b:
    assert b._upper is not None  # the daemon of the tests runs on this host
    b.run("head -c 3M /dev/zero > /tmp/a && mkdir -p /tmp/d && for i in $(seq 50); do echo $i > /tmp/d/$i; done")
    rows = docker_client.api.containers(all=True, size=True, filters={"id": b.container.id})
    assert b.disk_used() == rows[0]["SizeRw"] > 3 << 20
    t0 = time.time()
    with pytest.raises(SandboxError) as e:
      b.run("head -c 40M /dev/zero > /tmp/big; sleep 100; echo never")
    assert e.value.kind == DISK_LIMIT and "over its storage limit of 20 MiB" in str(e.value)
    assert time.time() - t0 < 30, time.time() - t0  # not after the 100 s sleep
