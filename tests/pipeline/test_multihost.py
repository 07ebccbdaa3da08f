"""Multi-host RPR (rsi_jax.pipeline.multihost): two JAX processes (gloo on loopback, 4 + 4 CPU devices) each
run their share of the episodes on a sampler over their own local device; one RPR step trains on the global
batch over the 8-device learner mesh and syncs the new weights to both samplers. A single process over 8
devices runs the same step as the reference."""

import json
import sys
from pathlib import Path

import pytest

from tests.processes import cpu_env, free_port, run_all

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
WORKER = Path(__file__).with_name("multihost_worker.py")


def test_two_process_rpr_step_matches_one_process(tmp_path):
  port = free_port()
  peers = [cpu_env(4, RSI_COORDINATOR=f"127.0.0.1:{port}", RSI_NUM_PROCESSES="2", RSI_PROCESS_ID=str(i))
           for i in range(2)]
  runs = [(tmp_path / "p0.json", peers[0]), (tmp_path / "p1.json", peers[1]), (tmp_path / "ref.json", cpu_env(8))]
  for rc, log in run_all([([sys.executable, str(WORKER), str(out)], env) for out, env in runs]):
    assert rc == 0, log[-4000:]
  p0, p1, ref = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("p0", "p1", "ref"))

  # host-to-host exchanges: shares, gathers in process order, one process's result for all, summed counts
  assert (p0["share"], p1["share"], ref["share"]) == ([0, 1, 2], [3, 4], [0, 1, 2, 3, 4])
  assert p0["gathered"] == p1["gathered"] == [0, 0, 1, 1]
  assert p0["from_primary"] == p1["from_primary"] == "made by 0"
  assert p0["counts"] == p1["counts"] == {"episodes": 6, "only_0": 1, "only_1": 1}
  # a failure on one process reaches every process instead of leaving the others waiting
  assert p0["primary_failed"] == "ValueError: no tasks on this host"
  assert p1["primary_failed"] == "PrimaryFailed: on the first process: ValueError: no tasks on this host"
  # a stop notice that cut the first process's work (RSR's funnel, an evaluation) or one process's share of a
  # step's episodes stops every process at that exchange; without one the exchange is a gather
  for p in (p0, p1):
    assert (p["primary_stopped"], p["share_stopped"], p["none_stopped"]) == (
        "StopRequested: SIGTERM", "StopRequested: SIGTERM", [0, 1]), p
  assert (ref["primary_stopped"], ref["share_stopped"], ref["none_stopped"]) == ("StopRequested: SIGTERM", [0], [0])
  for p in (p0, p1):
    assert p["unpicklable"].startswith("RuntimeError: gathering across processes failed: process 1:"), p

  # an HF import from each host's own copy of the folder: the same files load everywhere (the single-process
  # import's weights); different files, or a host that cannot read its copy, fail on every process
  assert isinstance(p0["hf_same"], float) and p0["hf_same"] == p1["hf_same"] == pytest.approx(ref["hf_same"])
  for p, d in ((p0, "WORK/hf_changed_on_1_0"), (p1, "WORK/hf_changed_on_1_1")):
    assert p["hf_changed_on_1"] == (
        f"HFImportError: {d}: the hosts read different weights (processes grouped by what they read: [0] / [1]): "
        "[1] differ from [0] in 1 of 13 tensors (first: decoder/decoder_norm/scale); every host needs the same "
        "checkpoint files"), p
  assert p1["hf_missing_on_1"] == "HFImportError: WORK/hf_missing_on_1_1: no *.safetensors files"
  assert p0["hf_missing_on_1"] == ("HFImportError: WORK/hf_missing_on_1_0: process(es) [1] could not import it "
                                   "(process 1: HFImportError: WORK/hf_missing_on_1_1: no *.safetensors files)")
  assert isinstance(ref["hf_changed_on_1"], float) and isinstance(ref["hf_missing_on_1"], float)

  # each process ran its own half of the requests on its own devices
  assert (p0["process"], p0["processes"], p0["devices"], p1["process"]) == (0, 2, 8, 1)
  assert len(p0["local_devices"]) == len(p1["local_devices"]) == 4
  assert not set(p0["local_devices"]) & set(p1["local_devices"])
  assert p0["requests"] == [0, 1, 2, 3] and p1["requests"] == [4, 5, 6, 7]
  # the global batch holds both processes' episodes, in process order, identical on both processes
  assert p0["global_episodes"] == p1["global_episodes"] == list(range(8))
  assert p0["batch_sha"] == p1["batch_sha"]
  for row, ids in zip(p0["batch_tokens"], p0["local_episodes"] + p1["local_episodes"]):
    assert row[:len(ids)] == ids and not any(row[len(ids):])
  # and is the batch one process over all 8 devices builds from the same requests (seeded sampling)
  assert ref["processes"] == 1 and ref["batch_sha"] == p0["batch_sha"]

  # one update ran; both processes report the same losses, equal to the single-process step's
  assert p0["updates"] == p1["updates"] == ref["updates"] == 1
  for k in ("loss", "policy_loss", "value_loss"):
    assert p0[k] == p1[k]
    assert p0[k] == pytest.approx(ref[k], rel=1e-4, abs=1e-5)
  # the update moved the weights, and every sampler now holds the learner's new weights
  assert p0["learner_after"] != p0["before"]
  for p in (p0, p1):
    assert p["sampler_after"] == pytest.approx(p["learner_after"], rel=1e-6)
  assert p0["sampler_after"] == p1["sampler_after"]
  assert p0["learner_after"] == pytest.approx(ref["learner_after"], rel=1e-5)
