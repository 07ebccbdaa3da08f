"""Terminal environments: task loading, Docker sandboxes, agent harnesses, protected verification, episodes, the pool.

Typical use (the rollout loop)::

    tasks = load_tasks(cfg.env.tasks_dir)
    pool = EnvPool.from_config(cfg.env, run_id, hygiene_patterns=cfg.reward.hygiene_patterns)
    harness = make_harness(cfg.env.harness, policy, ChatRenderer(load_tokenizer()), sampling, cfg.env)
    futures = [pool.submit(task, harness) for task in batch]     # concurrent episodes
    result = futures[0].result()                                  # EpisodeResult
    result.outcome        # rsi_jax.rl.ctrf.VerificationOutcome: state, success S, passed P, total N
    result.segments       # linear token sequences: ids, gen_mask, logprobs, turn_ids, weight_versions
    result.infra_failure  # masked out of training; pool.counts counts them by failure_kind

Containers need Docker (``scripts/docker_up.sh``) and the local base image (``scripts/build_base_image.sh``);
task images must provide bash, coreutils and util-linux (``setsid``), as rsi-base does.
"""

from rsi_jax.env.actions import Action, ActionError, parse_json_action, parse_xml_action
from rsi_jax.env.dockerfiles import effective_image_map
from rsi_jax.env.harness import (AgentRun, ChatHarness, Harness, JsonHarness, OracleHarness, ScriptedPolicy,
                                 Segment, Turn, XmlHarness, build_segment, make_harness)
from rsi_jax.env.images import build_task_image
from rsi_jax.env.episode import EnvSettings, EpisodeResult, run_episode
from rsi_jax.env.pool import EnvPool
from rsi_jax.env.reaper import install_signal_handlers, reap_containers, reap_orphans
from rsi_jax.env.sandbox import CommandResult, DockerSandbox, SandboxError, docker_client
from rsi_jax.env.tasks import Task, TaskError, load_task, load_tasks
from rsi_jax.env.verifier import VerifierRun, verify
