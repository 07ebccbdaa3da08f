"""rsi_jax.rl"""

from rsi_jax.rl.advantages import (TBGAECarry, TBGAEResult, gae, gae_associative, tb_gae,
                                   tb_gae_associative)
from rsi_jax.rl.losses import ppo_policy_loss, sft_loss, value_loss
from rsi_jax.rl.metrics import explained_variance, masked_sample_mean, reward_outside_mask
from rsi_jax.rl.ctrf import (CTRFReport, VerificationOutcome, VerificationState, parse_ctrf,
                             read_verifier_dir, verification_outcome)
from rsi_jax.rl.divisors import (DivisorTable, FamilyDivisor, calibrate_fdr_divisors, divisor_table_from_config,
                                 load_divisor_table, recalibrate_spr_divisors)
from rsi_jax.rl.outcome_table import OutcomeTable, read_outcome_table
from rsi_jax.rl.rewards import fdr_reward, outcome_rewards, reward_fn, score_table, spr_reward
