"""Task loading (both upstream layouts, the shipped suite), malformed folders, and the base-image map."""

import logging
import re
import shutil

import pytest

from rsi_jax.env.dockerfiles import effective_image_map, rewrite_dockerfile
from rsi_jax.env.tasks import LAYOUT_HARBOR, LAYOUT_TB1, TaskError, load_task, load_tasks, parse_memory

from .conftest import FIXTURES, REPO


def test_harbor_fixture_fields():
  t = load_task(FIXTURES / "harbor-greeting")
  assert t.layout == LAYOUT_HARBOR
  assert t.family == "fixture" and t.difficulty == "easy" and t.tags == ("files",)
  assert t.agent_timeout_s == 120.0 and t.verifier_timeout_s == 60.0 and t.build_timeout_s == 120.0
  assert t.cpus == 1.0 and t.memory_bytes == 512 * 2**20 and t.pids_limit is None
  assert t.instruction.startswith("Write the line")
  assert t.context_dir.name == "environment" and t.test_script == "/tests/test.sh"
  assert t.solution.name == "solve.sh"


def test_tb1_fixture_fields():
  t = load_task(FIXTURES / "tb1-word-sum")
  assert t.layout == LAYOUT_TB1
  assert t.family == "fixture-tb1" and t.difficulty == "easy"
  assert t.agent_timeout_s == 120.0 and t.verifier_timeout_s == 60.0
  assert "/app/numbers.txt" in t.instruction
  assert t.test_script == "/tests/run-tests.sh" and [p.name for p in t.extra_test_files] == ["run-tests.sh"]
  # the build context never holds the tests or the solution
  assert {"tests", "solution.sh", "run-tests.sh", "task.yaml"} <= set(t.context_exclude)


def test_shipped_suite_loads():
  tasks_dir = REPO / "tasks"
  if not tasks_dir.is_dir():
    pytest.skip("no shipped tasks/ folder")
  tasks = load_tasks(tasks_dir)
  families = {t.family for t in tasks if not t.name.startswith("upstream-")}
  layouts = {t.layout for t in tasks}
  assert len(tasks) >= 16 and len(families) >= 4
  assert layouts == {LAYOUT_HARBOR, LAYOUT_TB1}
  assert all(t.solution is not None for t in tasks)


def _copy(tmp_path, name="harbor-greeting"):
  dst = tmp_path / name
  shutil.copytree(FIXTURES / name, dst)
  return dst


@pytest.mark.parametrize("edit, file, field", [
    (lambda d: (d / "task.toml").write_text("version = \n"), "task.toml", "invalid TOML"),
    (lambda d: (d / "task.toml").write_text('[verifier]\ntimeout_sec = "soon"\n'), "task.toml",
     "verifier.timeout_sec"),
    (lambda d: (d / "task.toml").write_text('[environment]\nmemory = "lots"\n'), "task.toml",
     "environment.memory"),
    (lambda d: (d / "task.toml").write_text('[environment]\ncpus = -1\n'), "task.toml", "environment.cpus"),
    (lambda d: (d / "task.toml").write_text('[metadata]\ntags = "a"\ncategory = 3\n'), "task.toml",
     "metadata.category"),
    (lambda d: (d / "task.toml").write_text('metadata = 3\n'), "task.toml", "'metadata'"),
    (lambda d: (d / "instruction.md").unlink(), "instruction.md", "missing file"),
    (lambda d: (d / "instruction.md").write_text("  \n"), "instruction.md", "empty"),
    (lambda d: (d / "environment" / "Dockerfile").unlink(), "Dockerfile", "missing file"),
    (lambda d: (d / "tests" / "test.sh").unlink(), "test.sh", "missing file"),
    (lambda d: (d / "task.toml").write_bytes(b'[metadata]\ncategory = "caf\xe9"\n'), "task.toml", "not UTF-8"),
    (lambda d: (d / "instruction.md").write_bytes(b"caf\xe9\n"), "instruction.md", "not UTF-8"),
])
def test_malformed_harbor_task_names_file_and_field(tmp_path, edit, file, field):
  d = _copy(tmp_path)
  edit(d)
  with pytest.raises(TaskError) as e:
    load_task(d)
  assert file in str(e.value) and field in str(e.value)


@pytest.mark.parametrize("text, field", [
    ("difficulty: easy\n", "'instruction'"),
    ("instruction: [1, 2]\n", "'instruction'"),
    ("instruction: x\nmax_test_timeout_sec: 0\n", "max_test_timeout_sec"),
    ("- a list\n", "top level"),
    ("instruction: 'unclosed\n", "invalid YAML"),
])
def test_malformed_tb1_task_names_file_and_field(tmp_path, text, field):
  d = _copy(tmp_path, "tb1-word-sum")
  (d / "task.yaml").write_text(text)
  with pytest.raises(TaskError) as e:
    load_task(d)
  assert "task.yaml" in str(e.value) and field in str(e.value)


def test_not_a_task(tmp_path):
  with pytest.raises(TaskError, match="neither task.toml"):
    load_task(tmp_path)
  with pytest.raises(TaskError, match=f"{tmp_path}: no task folder"):
    load_tasks(tmp_path)
  with pytest.raises(TaskError, match="tasks directory does not exist"):
    load_tasks(tmp_path / "nowhere")


def test_non_utf8_tb1_task(tmp_path):
  d = _copy(tmp_path, "tb1-word-sum")
  (d / "task.yaml").write_bytes(b"instruction: caf\xe9\n")
  with pytest.raises(TaskError, match=r"task.yaml: not UTF-8 text \(byte 16"):
    load_task(d)


def test_parse_memory():
  assert parse_memory("2G") == 2 * 2**30
  assert parse_memory("512M") == 512 * 2**20
  assert parse_memory("1.5GiB") == int(1.5 * 2**30)
  assert parse_memory(4096) == 4096 * 2**20  # Harbor's memory_mb
  with pytest.raises(ValueError):
    parse_memory("2X")


def test_image_map_rewrites_only_missing_images(caplog):
  local = {"rsi-base", "mylocal:1", "rsi-base-noble"}
  m = effective_image_map({"node:*": "rsi-base"}, "rsi-base")
  text = ("FROM ubuntu:24.04 AS build\nRUN true\nFROM build\nFROM --platform=linux/amd64 python:3.12-slim\n"
          "from mylocal:1\nFROM node:20\nFROM alpine:3\n")
  with caplog.at_level(logging.INFO, logger="rsi_jax.env.dockerfiles"):
    new, changes = rewrite_dockerfile(text, m, lambda n: n in local)
  assert new.splitlines() == ["FROM rsi-base-noble AS build", "RUN true", "FROM build",
                              "FROM --platform=linux/amd64 rsi-base-noble", "from mylocal:1", "FROM rsi-base",
                              "FROM alpine:3"]
  assert changes == [("ubuntu:24.04", "rsi-base-noble"), ("python:3.12-slim", "rsi-base-noble"),
                     ("node:20", "rsi-base")]
  assert "ubuntu:24.04 is not available locally; using rsi-base-noble" in caplog.text


@pytest.mark.parametrize("ref, family", [
    ("ubuntu:24.04", "rsi-base-noble"), ("ubuntu", "rsi-base-noble"), ("ubuntu:noble-20250101", "rsi-base-noble"),
    ("ubuntu:22.04", "rsi-base-jammy"), ("ubuntu:20.04", "rsi-base-jammy"),
    ("debian:bookworm-slim", "rsi-base"), ("debian:trixie", "rsi-base-trixie"), ("debian:13", "rsi-base-trixie"),
    ("python:3.13-slim-bookworm", "rsi-base-trixie"), ("python:3.13", "rsi-base-trixie-build"),
    ("python:3.12-slim", "rsi-base-noble"), ("python:3.11", "rsi-base-build"), ("python:3.11-slim", "rsi-base"),
    ("python:3.10-slim", "rsi-base-jammy"), ("python:3.9-slim", "rsi-base"), ("python:3-slim", "rsi-base-trixie"),
    ("python", "rsi-base-trixie-build"), ("buildpack-deps:jammy", "rsi-base-jammy-build"),
    ("buildpack-deps:bookworm-scm", "rsi-base-build"), ("buildpack-deps:noble", "rsi-base-noble-build"),
    ("ghcr.io/laude-institute/t-bench/python-3-13:20250620", "rsi-base-trixie"),
    ("ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624", "rsi-base-noble"),
])
def test_upstream_images_map_to_the_matching_family(ref, family):
  """Each upstream image meets the family image of its release / Python version (built: used); a family image
  that is not built falls back to the base image, and the run start names the command that builds it."""
  from rsi_jax.env.dockerfiles import family_spec, resolve_base_image
  m = effective_image_map({}, "rsi-base")
  assert resolve_base_image(ref, m, lambda n: n in (family, "rsi-base")) == family
  assert resolve_base_image(ref, m, lambda n: n == "rsi-base") == "rsi-base"
  assert resolve_base_image(ref, m, lambda n: False) == family  # nothing built: the build names the family image
  assert family_spec(family).split("-")[0] in ("bookworm", "trixie", "jammy", "noble")


def test_family_names_match_the_build_script():
  """The names the map uses are the ones scripts/build_base_image.sh gives (SPEC -> image and back)."""
  from rsi_jax.env.dockerfiles import family_image, family_spec
  script = (REPO / "scripts" / "build_base_image.sh").read_text()
  specs = re.search(r'all_specs="([^"]+)"', script).group(1).split()
  assert len(specs) == 8
  for spec in specs:
    suite, build = spec.removesuffix("-build"), spec.endswith("-build")
    assert family_spec(family_image("rsi-base", suite, build)) == spec
  assert family_image("rsi-base", "bookworm") == "rsi-base"
  assert family_image("rsi-base", "noble", True) == "rsi-base-noble-build"


@pytest.mark.parametrize("ref, short", [
    ("ubuntu", "ubuntu:latest"), ("docker.io/library/ubuntu:24.04", "ubuntu:24.04"),
    ("library/debian:bookworm-slim", "debian:bookworm-slim"),
    ("public.ecr.aws/docker/library/python:3.12-slim@sha256:" + "a" * 64, "python:3.12-slim"),
    ("mirror.gcr.io/library/python", "python:latest"), ("python@sha256:" + "b" * 64, "python:latest"),
    ("ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624", "ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624"),
    ("localhost:5000/img", "localhost:5000/img:latest"),
])
def test_references_of_official_images_are_mapped(ref, short):
  from rsi_jax.env.dockerfiles import canonical_image, resolve_base_image
  assert canonical_image(ref) == short
  m = effective_image_map({}, "rsi-base")
  want = "rsi-base" if short.split(":")[0] in ("ubuntu", "debian", "python") or "laude" in ref else ref
  assert resolve_base_image(ref, m, lambda n: n == "rsi-base") == want


def test_base_image_problems_are_named(tmp_path):
  from rsi_jax.env.dockerfiles import base_image_problems
  d = _copy(tmp_path)
  (d / "environment" / "Dockerfile").write_text(
      "FROM ubuntu AS b\nFROM b\nFROM ${BASE}\nFROM node:20\nFROM quay.io/x/y:1\nFROM debian:12\n")
  t = load_task(d)
  lines = base_image_problems([t], effective_image_map({}, "rsi-base"), lambda n: n == "rsi-base")[t.name]
  assert lines[0] == ("base image ubuntu maps to rsi-base-noble, which is not built (bash "
                      "scripts/build_base_image.sh noble); using rsi-base")
  assert [x.split(" is ")[0] for x in lines[1:]] == ["registry_only: base image node:20",
                                                      "registry_only: base image quay.io/x/y:1"]
  built = {"rsi-base", "rsi-base-noble", "node:20"}
  assert base_image_problems([t], effective_image_map({"quay.io/*": "rsi-base"}, "rsi-base"),
                             lambda n: n in built) == {}


def test_configured_map_wins_over_defaults():
  m = effective_image_map({"ubuntu:*": "other-base"}, "rsi-base")
  new, _ = rewrite_dockerfile("FROM ubuntu:22.04\n", m, lambda n: False)
  assert new == "FROM other-base\n"
  new, _ = rewrite_dockerfile("FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624\n", m, lambda n: False)
  assert new == "FROM rsi-base-noble\n"


def test_quoted_copy_of_private_files_is_hidden_too(tmp_path):
  """deveval's Dockerfiles quote their COPY arguments (``COPY "tests/" "/app/tests/"``): the files copied are
  private all the same (hidden from the agent, put back for the verifier)."""
  d = tmp_path / "tb1-quoted"
  shutil.copytree(FIXTURES / "tb1-word-sum", d)
  (d / "Dockerfile").write_text((d / "Dockerfile").read_text() + 'COPY "tests/" "/opt/t/"\n')
  task = load_task(d)
  assert task.private_in_image == ("/opt/t/test_outputs.py",)
  assert task.private_origin["/opt/t/test_outputs.py"] == d / "tests" / "test_outputs.py"
