"""Task folders are untrusted input: every folder of a suite is loaded or refused with every reason; links that
leave a folder or lead nowhere, names that are not UTF-8 and task-specific base images are refused, never
followed or replaced."""

import os
import shutil

import pytest

from rsi_jax.env.dockerfiles import effective_image_map, image_check, resolve_base_image
from rsi_jax.env.tasks import TaskError, load_suite, load_task, load_tasks

from .conftest import FIXTURES

SHADOW = "/etc/shadow"  # readable by root only


def _copy(root, name="harbor-greeting", as_name=None):
  dst = root / (as_name or name)
  shutil.copytree(FIXTURES / name, dst)
  return dst


def _refusal(d) -> str:
  with pytest.raises(TaskError) as e:
    load_task(d)
  assert "\n" not in str(e.value)
  return e.value.reason


@pytest.mark.parametrize("where, target, through", [
    ("environment/secret", SHADOW, ""),  # absolute
    ("environment/secret", "../../../../../../../../etc/shadow", ""),  # relative, out through ..
    ("environment/etc", "/etc", ""),  # a folder: the build would copy its whole tree
    ("tests/data", "../environment/hop", "environment/hop -> /etc/shadow"),  # a chain: inside, then out
])
def test_links_that_leave_the_task_folder_are_refused(tmp_path, where, target, through):
  d = _copy(tmp_path)
  if through:
    os.symlink(SHADOW, d / "environment" / "hop")
  os.symlink(target, d / where)
  reason = _refusal(d)
  assert f"symlink {where} -> {target} leaves the task folder" in reason
  assert through in reason
  suite = load_suite(tmp_path)
  assert suite.tasks == [] and [(r.task, r.reason) for r in suite.refused] == [("harbor-greeting", reason)]


def test_a_chain_that_leaves_and_comes_back_is_refused(tmp_path):
  """A link whose chain reads a path outside the folder is refused even when the chain ends inside it."""
  d = _copy(tmp_path)
  outside = tmp_path / "outside-link"
  os.symlink(d / "environment" / "input.txt", outside)
  os.symlink(outside, d / "environment" / "back")
  assert "symlink environment/back -> " in _refusal(d) and "leaves the task folder" in _refusal(d)


def test_dangling_and_looping_links_are_refused(tmp_path):
  d = _copy(tmp_path)
  os.symlink("missing.txt", d / "environment" / "gone")
  os.symlink("b", d / "environment" / "a")
  os.symlink("a", d / "environment" / "b")
  reason = _refusal(d)
  assert "symlink environment/gone -> missing.txt is dangling (its target does not exist)" in reason
  assert "symlink environment/a -> b is a loop of links" in reason


def test_links_inside_the_folder_and_plain_folders_load(tmp_path):
  d = _copy(tmp_path)
  os.symlink("input.txt", d / "environment" / "alias.txt")
  os.symlink("../tests", d / "environment" / "tests-view")
  assert load_task(d).name == "harbor-greeting"


def test_names_that_are_not_utf8_and_special_files_are_refused(tmp_path):
  d = _copy(tmp_path)
  (d / "environment" / os.fsdecode(b"caf\xe9.txt")).write_text("x")
  os.mkfifo(d / "environment" / "pipe")
  reason = _refusal(d)
  assert "file name is not UTF-8: environment/caf\\xe9.txt" in reason
  assert "environment/pipe is not a regular file, a folder or a link" in reason


def test_every_folder_of_a_suite_is_loaded_or_refused(tmp_path):
  """A folder without a metadata file, one with Task.toml, a malformed one: each refused with its reason, the
  others loaded; --strict (load_tasks) stops at the first refused folder."""
  _copy(tmp_path, as_name="good")
  _copy(tmp_path, "tb1-word-sum", as_name="good-tb1")
  (tmp_path / "no-metadata").mkdir()
  (_copy(tmp_path, as_name="capitalised") / "task.toml").rename(tmp_path / "capitalised" / "Task.toml")
  (_copy(tmp_path, as_name="bad-toml") / "task.toml").write_text("version = \n")
  (tmp_path / ".git").mkdir()  # hidden folders are not task folders
  (tmp_path / "README.md").write_text("a suite\n")
  suite = load_suite(tmp_path)
  assert [t.name for t in suite.tasks] == ["good", "good-tb1"]
  reasons = {r.task: r.reason for r in suite.refused}
  assert sorted(reasons) == ["bad-toml", "capitalised", "no-metadata"]
  assert reasons["capitalised"] == "Task.toml: the metadata file must be named task.toml (names are case-sensitive)"
  assert reasons["no-metadata"].startswith("neither task.toml")
  assert reasons["bad-toml"].startswith("task.toml: invalid TOML")
  with pytest.raises(TaskError, match=f"^{tmp_path}/bad-toml: task.toml: invalid TOML"):
    load_tasks(tmp_path)
  with pytest.raises(TaskError, match="bad-toml"):
    load_suite(tmp_path, strict=True)


def test_named_tasks_once_each_and_unknown_names_refused(tmp_path):
  _copy(tmp_path, as_name="good")
  suite = load_suite(tmp_path, ["good", "good", "nosuch", "../good"])
  assert [t.name for t in suite.tasks] == ["good"]
  assert suite.notes == ["task good is named 2 times: evaluated once"]
  assert {r.task: r.reason for r in suite.refused} == {"nosuch": f"no such task folder in {tmp_path}",
                                                       "../good": "not a folder name of the suite"}


def test_every_reason_is_reported_not_only_the_first(tmp_path):
  """A SWE-bench task in TB1 layout: its parser, its per-instance image and a missing file, all named."""
  d = _copy(tmp_path, "tb1-word-sum", as_name="django__django-1")
  (d / "task.yaml").write_text((d / "task.yaml").read_text().replace("parser_name: pytest", "parser_name: swebench"))
  (d / "Dockerfile").write_text("FROM swebench/sweb.eval.x86_64.django_1776_django-1:latest\nRUN true\n")
  (d / "run-tests.sh").unlink()
  m = effective_image_map({}, "rsi-base")
  with pytest.raises(TaskError) as e:
    load_task(d, image_check(m, lambda n: n == "rsi-base"))
  reason = e.value.reason
  assert reason.startswith("run-tests.sh: missing file; ")
  assert "; task.yaml: field 'parser_name' is 'swebench'; only 'pytest' is supported; " in reason
  assert "registry_only: base image swebench/sweb.eval.x86_64.django_1776_django-1:latest is a per-instance " \
         "SWE-bench image" in reason


@pytest.mark.parametrize("ref", ["ghcr.io/laude-institute/t-bench/deveval:latest",
                                 "ghcr.io/laude-institute/t-bench/deveval@sha256:" + "c" * 64,
                                 "ghcr.io/laude-institute/t-bench/python-3-13-extra:1",
                                 "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest",
                                 "docker.io/swebench/sweb.eval.x86_64.pytest-dev_1776_pytest-7205:latest"])
def test_task_specific_images_are_refused_not_replaced(tmp_path, ref):
  """deveval's image carries git, cmake, make, Java and pytest plugins; SWE-bench's carry the repository: no local
  image stands in for them. Present locally, or mapped on purpose in env.image_map, they are used."""
  m = effective_image_map({}, "rsi-base")
  local = lambda n: n in ("rsi-base", "rsi-base-trixie", "rsi-base-noble")  # noqa: E731
  assert resolve_base_image(ref, m, local) == ref  # never silently rewritten
  d = _copy(tmp_path)
  (d / "environment" / "Dockerfile").write_text(f"FROM --platform=linux/amd64 {ref}\nCOPY input.txt /app/\n")
  with pytest.raises(TaskError) as e:
    load_task(d, image_check(m, local))
  assert e.value.reason.startswith(f"registry_only: base image {ref} is ")
  assert "only a registry has it" in e.value.reason
  assert load_task(d, image_check(m, lambda n: local(n) or n == ref)).name == d.name  # present locally
  mapped = effective_image_map({ref.split(":")[0].split("@")[0] + "*": "rsi-base"}, "rsi-base")
  assert load_task(d, image_check(mapped, local)).name == d.name  # the user's own map entry
  assert resolve_base_image(ref, mapped, local) == "rsi-base"


@pytest.mark.parametrize("ref", ["ghcr.io/laude-institute/t-bench/python-3-13:20250620",
                                 "ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624", "ubuntu:24.04",
                                 "python:3.12-slim", "buildpack-deps:jammy", "debian:bookworm-slim"])
def test_images_the_family_stands_for_load(tmp_path, ref):
  m = effective_image_map({}, "rsi-base")
  d = _copy(tmp_path)
  (d / "environment" / "Dockerfile").write_text(f"FROM {ref}\n")
  assert load_task(d, image_check(m, lambda n: n == "rsi-base")).name == d.name
