"""Test-wide setup: 8 fake CPU devices (sharding tests build meshes from them) before JAX is imported."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


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
