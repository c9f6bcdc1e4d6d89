# The rollout-correction settings of verl's two examples (examples/rollout_correction/ in verl), shared by the GPU
# scripts here and their tiny CPU copies (sourced, not run).

# Bypass mode, self-normalised sequence-level importance weights truncated at 2, the REINFORCE loss (RLOO).
SEQ_IS_REINFORCE=(
    algorithm.rollout_correction.rollout_is=sequence
    algorithm.rollout_correction.rollout_is_threshold=2.0
    algorithm.rollout_correction.rollout_is_batch_normalize=true
    algorithm.rollout_correction.rollout_rs=null
    algorithm.rollout_correction.rollout_rs_threshold=null
    algorithm.rollout_correction.bypass_mode=true
    algorithm.rollout_correction.loss_type=reinforce
)

# Bypass mode, PPO clipping, two rejection criteria: token_k1 in [0.6, 1.6] and seq_max_k2 at most 2.5 (GRPO).
MULTI_RS_PPO_CLIP=(
    algorithm.rollout_correction.rollout_is=token
    algorithm.rollout_correction.rollout_is_threshold=2.0
    algorithm.rollout_correction.rollout_is_batch_normalize=false
    algorithm.rollout_correction.rollout_rs="'token_k1,seq_max_k2'"
    algorithm.rollout_correction.rollout_rs_threshold="'0.6_1.6,2.5'"
    algorithm.rollout_correction.bypass_mode=true
    algorithm.rollout_correction.loss_type=ppo_clip
)

# What both examples set beside the correction: the engine's own log-probs, one epoch, no KL term.
CORRECTION_COMMON=(
    algorithm.gamma=1.0
    actor_rollout_ref.actor.ppo_epochs=1
    actor_rollout_ref.actor.use_kl_loss=false
    actor_rollout_ref.rollout.calculate_log_probs=true
)
