"""Names of the fields carried in a batch (`DataProto`) between the driver and the workers.

Every module refers to batch fields through these constants, never through string literals, so a
rename is one edit and a typo is an import error. Shapes: B = batch rows (prompt x n responses),
P = prompt length (left-padded), R = response length (right-padded), T = P + R.
"""

# --- tensors (DataProto.batch) -------------------------------------------------------------------
INPUT_IDS = "input_ids"  # (B, P) before generation, (B, T) after
ATTENTION_MASK = "attention_mask"  # same shape as input_ids; 1 on real tokens
POSITION_IDS = "position_ids"  # same shape as input_ids
PROMPTS = "prompts"  # (B, P) left-padded prompt ids
RESPONSES = "responses"  # (B, R) right-padded response ids
RESPONSE_MASK = "response_mask"  # (B, R) 1 on generated tokens up to and including EOS
ROLLOUT_LOG_PROBS = "rollout_log_probs"  # (B, R) log-probs the engine sampled with
ROLLOUT_POLICY_VERSIONS = "rollout_policy_versions"  # (B, R) int64: policy version that sampled each token, -1 on pad
# partial rollouts (rlpost.rollout.partial): a generation paused at weight pushes, carried between segments
PARTIAL_TOKENS = "partial_tokens"  # (B, R) ids sampled so far, pad id after them
PARTIAL_LOG_PROBS = "partial_log_probs"  # (B, R) the engine's log-prob of each of them
PARTIAL_LENGTH = "partial_length"  # (B,) int64: tokens sampled so far
PARTIAL_CAP = "partial_cap"  # (B,) int64: the row's response cap
PARTIAL_DONE = "partial_done"  # (B,) bool: the row stopped (EOS or its cap)
OLD_LOG_PROBS = "old_log_probs"  # (B, R) actor log-probs before the update
ENTROPYS = "entropys"  # (B, R) per-token entropy of the actor
SUM_PI_SQUARED = "sum_pi_squared"  # (B, R) sum over the vocabulary of the actor's squared probabilities (OTB)
ROUTED_EXPERTS = "routed_experts"  # (B, T, L, K) int: the experts each token was routed to (MoE router replay)
MOE_EXPERT_COUNTS = "moe_expert_counts"  # (B, L, E) int64: per row, the response tokens' top-k slots per expert
REF_LOG_PROB = "ref_log_prob"  # (B, R) reference-policy log-probs
TEACHER_LOG_PROBS = "teacher_log_probs"  # (B, R) log-probs of the sampled tokens under the row's teacher (distillation)
# top-k distillation: the student's k likeliest token ids at each response position (from the old-log-prob pass)
STUDENT_TOPK_IDS = "student_topk_ids"  # (B, R, k) int64
# the union of the student's and the teacher's top-k, sorted, and the teacher's log-probs of those ids (a
# duplicate id's earlier entry at -inf)
TEACHER_TOPK_IDS = "teacher_topk_ids"  # (B, R, 2k) int64
TEACHER_TOPK_LOG_PROBS = "teacher_topk_log_probs"  # (B, R, 2k)
TEACHER_OWN_TOPK_IDS = "teacher_own_topk_ids"  # (B, R, k) int64: the teacher's own k likeliest ids (overlap metric)
VALUES = "values"  # (B, R) critic values
RM_SCORES = "rm_scores"  # (B, R) reward-model score placed on the last response token
TOKEN_LEVEL_SCORES = "token_level_scores"  # (B, R) task score placed on the last response token
TOKEN_LEVEL_REWARDS = "token_level_rewards"  # (B, R) scores minus the in-reward KL penalty
ADVANTAGES = "advantages"  # (B, R)
RETURNS = "returns"  # (B, R)

# --- numpy object arrays (DataProto.non_tensor_batch) --------------------------------------------
UID = "uid"  # str: one id per prompt, shared by its n responses (the GRPO/RLOO group)
DATA_SOURCE = "data_source"  # str: selects the scorer and the validation metric group
REWARD_MODEL = "reward_model"  # dict: {"style": ..., "ground_truth": ...}
EXTRA_INFO = "extra_info"  # dict: free-form per-sample info passed to reward functions
RAW_PROMPT_IDS = "raw_prompt_ids"  # list[int]: prompt ids without padding (engine input)
RAW_PROMPT = "raw_prompt"  # list[dict]: the chat messages (data.return_raw_chat)
MULTI_MODAL_DATA = "multi_modal_data"  # dict: {"image": [PIL images]} of the row, for the engine
MULTI_MODAL_INPUTS = "multi_modal_inputs"  # dict: the processor's {pixel_values, image_grid_thw} of the row
IMAGE_MASK = "image_mask"  # (b, T) bool: the real image placeholder tokens of a micro-batch (engine/vision.py)
MM_ROW = "mm_row"  # (B,) int64: each row's index into the batch's multi_modal_inputs (the actor's micro-batches)
FULL_PROMPTS = "full_prompts"  # str: prompt text after the chat template (data.return_full_prompt)
INDEX = "index"  # int: row index in the source file
AGENT_NAME = "agent_name"  # str: the agent loop of the row (multi-turn rollouts)
TOOLS_KWARGS = "tools_kwargs"  # dict: {tool name: {"create_kwargs": {...}}} (from extra_info)
INTERACTION_KWARGS = "interaction_kwargs"  # dict: {"name": <interaction>, ...} (from extra_info)
OVER_SAMPLE_CUT = "over_sample_cut"  # bool: the row's group was cut by rollout.over_sample_rate (trainer drops it)
OVER_SAMPLE_ABORTED = "over_sample_aborted"  # bool: ... and its request was still running at the cut
NUM_TURNS = "__num_turns__"  # int: prompt + model turns + tool/user turns of a multi-turn rollout (verl's name)
AGENT_METRICS = "agent_metrics"  # dict: per-trajectory counters of the agent loop (tool_calls, truncated, ...)
TOOL_REWARDS = "tool_rewards"  # dict: {tool name: calc_reward of the trajectory's instance}
TURN_SCORES = "turn_scores"  # list[float]: the interaction's score of each of its turns
RESPONSE_CAPS = "response_caps"  # list[int]: per-sample response caps of a prompt (extra_info["response_caps"])

# --- meta_info --------------------------------------------------------------------------------------
META_EOS_TOKEN_ID = "eos_token_id"
META_PAD_TOKEN_ID = "pad_token_id"
META_DO_SAMPLE = "do_sample"
META_VALIDATE = "validate"  # True: the rollout uses rollout.val_kwargs.*
META_METRICS = "metrics"  # dict[str, float | list[float]] returned by update methods
META_TEMPERATURE = "temperature"
META_GLOBAL_STEP = "global_step"
META_ROLLOUT_SEGMENT = "rollout_segment"  # int: segments of a partial rollout run so far (seeds the next)
META_GLOBAL_TOKEN_NUM = "global_token_num"  # list[int]: tokens per row, for throughput metrics
META_CHAT_TEMPLATE_KWARGS = "chat_template_kwargs"  # dict: data.apply_chat_template_kwargs, for agent loops

# --- batch fields used by specific algorithms --------------------------------------------------------
REWARD_BASELINES = "reward_baselines"  # (B,) ReMax: score of the greedy response to the same prompt
RAW_INPUT_IDS = "raw_input_ids"  # list[int]: message contents without chat template (data.return_raw_input_ids)
LOSS_MASK = "loss_mask"  # (B, T) SFT: 1 on response tokens, the only ones the loss counts
ROLLOUT_IS_WEIGHTS = "rollout_is_weights"  # (B, R) rollout-correction weights pi_old / pi_rollout (truncated)
# dict: the distillation loss the actor adds ({loss_mode, coef, loss_max_clamp, log_prob_min_clamp}), with
# `teacher_log_probs` in the batch
META_DISTILLATION = "distillation"
# dict: algorithm.rollout_correction, when bypass mode corrects in the actor's loss
META_BYPASS_CORRECTION = "bypass_correction"
# int k: the old-log-prob pass also writes `student_topk_ids` (top-k distillation)
META_STUDENT_TOPK = "student_topk"
META_MOE_LOAD = "moe_load"  # true: compute_log_prob also returns MOE_EXPERT_COUNTS (the MoE load metrics' step)
