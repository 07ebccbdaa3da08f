"""One validated, immutable configuration object for the whole stack: the public API of the config modules.

Layout (MaxText style): ``configs/base.yml`` holds every default; a run file names its base with
``base_config:`` and its model with ``model_name:`` (loaded from ``configs/models/<name>.yml`` into the
``model`` section); command-line ``key=value`` overrides come last, with dotted keys for sections
(``actor_optim.learning_rate=1e-7``, ``mesh.ici_fsdp_parallelism=4``). Phase files
(``configs/phases/<phase>.yml``) fill in, per phase, what the user's files (the run file chain, ``base.yml``
aside) and command line did not set; the run file's ``pipeline.phase_overrides`` and then the command line come
over them (:func:`rsi_jax.pipeline.plan.phase_config`).

The schema (one frozen dataclass per section; unknown keys, wrong types and impossible values raise
:class:`ConfigError` naming the dotted key) is :mod:`rsi_jax.config_schema` (the whole config and its run,
sampler, environment, RSR, eval and pipeline sections) and :mod:`rsi_jax.config_learning` (the learner's
sections), over the shared checks of :mod:`rsi_jax.config_checks`; reading the YAML chain, model
files, phase overlays and ``key=value`` overrides into it is :mod:`rsi_jax.config_loader`. The resulting
:class:`Config` is passed down explicitly; nothing reads configuration from globals. Import from here.
"""

from rsi_jax.config_loader import (CONFIG_DIR, REPO_ROOT, _deep_merge, build_config, dump_config, load_cli_config,
                                   load_config, load_model_file, load_phase_overlay, parse_overrides, with_overrides)
from rsi_jax.config_checks import ConfigError, check_location
from rsi_jax.config_learning import MeshConfig, ModelConfig, OptimConfig, RLConfig, RewardConfig, RolloutConfig
from rsi_jax.config_schema import (PHASE_KINDS, Config, EnvConfig, EvalConfig, PipelineConfig, RSRConfig, RunConfig,
                                   SamplerConfig, _to_plain, phase_kind)
