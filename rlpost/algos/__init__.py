"""RL algorithms as pure functions over tensors (no Ray, vLLM or torch.distributed).

    advantages.py          advantage estimators, `ADV_ESTIMATORS`, `compute_advantage`
    kl.py                  KL estimators (`KL_ESTIMATORS`, `kl_penalty`), KL controllers, `apply_kl_penalty`
    losses.py              `agg_loss` (`LOSS_AGG_MODES`), `POLICY_LOSSES` and the PPO / GSPO / GPG losses,
                           `compute_value_loss`
    loss_variants.py       clip_cov, kl_cov, geo_mean (GMPO), cispo, sapo, topr, dro policy losses
    rollout_correction.py  off-policy importance weights / rejection, the bypass_mode loss
    filter_groups.py       DAPO dynamic sampling (groups with a non-constant metric)
    logits.py              entropy / log-probs from logits (memory-bounded)
    pf_ppo.py              PF-PPO resampling
Importing this package registers every estimator and loss; `rlpost.trainer.ppo.core_algos`
re-exports the same names under verl's module path.
"""

from rlpost.algos.advantages import (
    ADV_ESTIMATORS,
    AdvantageEstimator,
    compute_advantage,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_gdpo_outcome_advantage,
    compute_optimal_token_baseline_advantage,
    compute_tir_optimal_token_baseline_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)
from rlpost.algos.codapo import compute_codapo_outcome_advantage
from rlpost.algos.filter_groups import group_metric, kept_group_rows
from rlpost.algos.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_estimator_names,
    kl_penalty,
)
from rlpost.algos.logits import entropy_from_logits, entropy_from_logits_with_chunking, logprobs_from_logits
from rlpost.algos.loss_variants import (
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
    compute_policy_loss_topr,
)
from rlpost.algos.losses import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    agg_loss,
    cfg_value,
    compute_policy_loss,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
    compute_value_loss,
    get_policy_loss_fn,
    register_policy_loss,
)
from rlpost.algos.pf_ppo import compute_pf_ppo_reweight_data, pf_ppo_sample_indices
from rlpost.algos.rollout_correction import compute_policy_loss_bypass_mode, compute_rollout_correction

# compute_grpo_vectorized_outcome_advantage / compute_rloo_vectorized_outcome_advantage: verl's names
# for the registered `grpo_vectorized` / `rloo_vectorized`, which are the (already loop-free) grpo / rloo.
compute_grpo_vectorized_outcome_advantage = compute_grpo_outcome_advantage
compute_rloo_vectorized_outcome_advantage = compute_rloo_outcome_advantage

__all__ = [
    "ADV_ESTIMATORS", "AdvantageEstimator", "compute_advantage", "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage", "compute_codapo_outcome_advantage", "compute_optimal_token_baseline_advantage",
    "compute_tir_optimal_token_baseline_advantage", "compute_gpg_outcome_advantage", "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage", "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage", "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage", "compute_rloo_outcome_advantage", "compute_rloo_vectorized_outcome_advantage",
    "get_adv_estimator_fn", "register_adv_est",
    "group_metric", "kept_group_rows",
    "KL_ESTIMATORS", "AdaptiveKLController", "FixedKLController", "apply_kl_penalty", "get_kl_controller",
    "kl_estimator_names", "kl_penalty",
    "entropy_from_logits", "entropy_from_logits_with_chunking", "logprobs_from_logits",
    "compute_policy_loss_cispo", "compute_policy_loss_clip_cov", "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean", "compute_policy_loss_kl_cov", "compute_policy_loss_sapo",
    "compute_policy_loss_topr",
    "LOSS_AGG_MODES", "POLICY_LOSSES", "agg_loss", "cfg_value", "compute_policy_loss", "compute_policy_loss_gpg",
    "compute_policy_loss_gspo", "compute_policy_loss_vanilla", "compute_value_loss", "get_policy_loss_fn",
    "register_policy_loss",
    "compute_pf_ppo_reweight_data", "pf_ppo_sample_indices",
    "compute_policy_loss_bypass_mode", "compute_rollout_correction",
]
