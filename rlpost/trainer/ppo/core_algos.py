"""PPO-family algorithm functions under verl's names: `from rlpost.trainer.ppo import core_algos`.

Everything here is a pure function over tensors (no Ray, vLLM or torch.distributed). The code is
split by topic; this module re-exports it so verl imports keep working:
    advantages.py  advantage estimators, their registry, `compute_advantage`
    kl.py          KL estimators (`kl_penalty`), KL controllers, `apply_kl_penalty`
    losses.py      `agg_loss`, policy losses and their registry, `compute_value_loss`
    logits.py      entropy / log-probs from logits (memory-bounded)
    pf_ppo.py      PF-PPO resampling
    rlpost/utils/masked.py  masked_sum / masked_mean / masked_var / masked_whiten
"""

from rlpost.trainer.ppo.advantages import (
    ADV_ESTIMATORS,
    AdvantageEstimator,
    compute_advantage,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)
from rlpost.trainer.ppo.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
)
from rlpost.trainer.ppo.logits import (
    entropy_from_logits,
    entropy_from_logits_with_chunking,
    logprobs_from_logits,
)
from rlpost.trainer.ppo.losses import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    agg_loss,
    compute_policy_loss,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
    compute_value_loss,
    get_policy_loss_fn,
    register_policy_loss,
)
from rlpost.trainer.ppo.pf_ppo import compute_pf_ppo_reweight_data, pf_ppo_sample_indices
from rlpost.utils.masked import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "ADV_ESTIMATORS", "AdvantageEstimator", "compute_advantage", "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage", "compute_grpo_outcome_advantage", "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage", "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage", "compute_rloo_outcome_advantage", "get_adv_estimator_fn",
    "register_adv_est", "AdaptiveKLController", "FixedKLController", "apply_kl_penalty", "get_kl_controller",
    "kl_penalty", "entropy_from_logits", "entropy_from_logits_with_chunking", "logprobs_from_logits",
    "LOSS_AGG_MODES", "POLICY_LOSSES", "agg_loss", "compute_policy_loss", "compute_policy_loss_gpg",
    "compute_policy_loss_gspo", "compute_policy_loss_vanilla", "compute_value_loss", "get_policy_loss_fn",
    "register_policy_loss", "compute_pf_ppo_reweight_data", "pf_ppo_sample_indices", "masked_mean",
    "masked_sum", "masked_var", "masked_whiten",
]
