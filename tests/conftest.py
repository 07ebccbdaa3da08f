"""Test-wide setup: 8 fake CPU devices (sharding tests build meshes from them) before JAX is imported."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the whole test session and every process it starts (training runs,
# worker pairs inherit the environment): the same programs are compiled once, not once per process. A fresh
# folder per session (removed at exit) unless JAX_COMPILATION_CACHE_DIR is set. A test that must see a real
# compile (XLA's compile-time warnings) starts its child with JAX_ENABLE_COMPILATION_CACHE=false
# (tests/models/test_sharding_hygiene.py).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import atexit
  import shutil
  import tempfile
  _cache = tempfile.mkdtemp(prefix="rsi-jax-test-compile-cache-")
  atexit.register(shutil.rmtree, _cache, True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# The tests that send SIGINT (Ctrl-C) to a child process need the child to receive it. A shell starts a
# background job (`cmd &`, nohup) with SIGINT ignored, and an ignored signal stays ignored in every child, so
# under such a launch those children would run on as if nothing were sent (four such tests failed so). A
# handler, unlike "ignore", is reset to the default when a child starts: give the session Python's own.
import signal  # noqa: E402

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)


import pytest  # noqa: E402


def _connect():
  from rsi_jax.env.sandbox import SandboxError, docker_client
  try:
    return docker_client()
  except SandboxError as e:
    return e


@pytest.fixture(scope="session")
def docker_client():
  """The Docker daemon: without one (or without the rsi-base image) Docker tests are skipped, or FAIL when
  ``RSI_REQUIRE_DOCKER=1`` (CI, scripts/test.sh)."""
  c = _connect()
  if isinstance(c, Exception):
    msg = f"no Docker daemon: {c} (scripts/docker_up.sh starts one)"
    if os.environ.get("RSI_REQUIRE_DOCKER") == "1":
      pytest.fail(msg)
    pytest.skip(msg)
  try:
    c.images.get("rsi-base")
  except Exception:  # noqa: BLE001
    msg = "image rsi-base is missing (scripts/build_base_image.sh builds it)"
    if os.environ.get("RSI_REQUIRE_DOCKER") == "1":
      pytest.fail(msg)
    pytest.skip(msg)
  return c
