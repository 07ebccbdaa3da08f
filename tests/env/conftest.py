"""Docker fixtures for the environment tests (``docker_client`` itself is in tests/conftest.py).

Every container the tests start carries ``rsi_jax.run=<run_id>``; at the
end of the session none may remain.
"""

import uuid
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"
REPO = Path(__file__).resolve().parents[2]
RUN_ID = f"pytest-{uuid.uuid4().hex[:8]}"
# The fixture tasks' own verifier tests run inside containers, never here.
collect_ignore_glob = ["fixtures/*"]


@pytest.fixture(scope="session")
def run_id():
  return RUN_ID


@pytest.fixture(scope="session")
def settings(run_id):
  from rsi_jax.env.episode import EnvSettings
  return EnvSettings(run_id=run_id, command_timeout_s=30.0)


@pytest.fixture(scope="session")
def fixture_tasks():
  from rsi_jax.env.tasks import load_tasks
  return {t.name: t for t in load_tasks(FIXTURES)}


@pytest.fixture(scope="session")
def tokenizer():
  from rsi_jax.models.tokenizer import load_tokenizer
  return load_tokenizer()


@pytest.fixture(scope="session")
def renderer(tokenizer):
  from rsi_jax.models.tokenizer import ChatRenderer
  return ChatRenderer(tokenizer)


@pytest.fixture(scope="session", autouse=True)
def no_container_left_behind():
  """After the whole session, no container labelled with this run's id may remain."""
  yield
  from tests.conftest import _connect
  c = _connect()
  if isinstance(c, Exception):
    return
  from rsi_jax.env.reaper import LABEL_RUN, reap_containers
  left = c.containers.list(all=True, filters={"label": f"{LABEL_RUN}={RUN_ID}"})
  reap_containers(c, RUN_ID)
  assert not left, f"containers left behind: {[x.short_id for x in left]}"
