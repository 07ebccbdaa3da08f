"""Terminal environments: task loading, Docker sandboxes, agent harnesses, protected verification, the pool."""

from rsi_jax.env.actions import Action, ActionError, parse_json_action, parse_xml_action
from rsi_jax.env.harness import (AgentRun, ChatHarness, Harness, JsonHarness, OracleHarness, ScriptedPolicy,
                                 Segment, Turn, XmlHarness, build_segment, make_harness)
from rsi_jax.env.pool import EnvPool, EnvSettings, EpisodeResult, run_episode
from rsi_jax.env.sandbox import (CommandResult, DockerSandbox, SandboxError, build_task_image, docker_client,
                                 install_signal_handlers, reap_containers, reap_orphans)
from rsi_jax.env.tasks import Task, TaskError, effective_image_map, load_task, load_tasks
from rsi_jax.env.verifier import VerifierRun, verify
