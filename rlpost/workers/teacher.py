"""`TeacherWorker`: the frozen teachers of on-policy distillation, FSDP2 forward-only models like the reference
policy, each scoring the student's sampled tokens.

Every teacher of `distillation.teacher_models` with a `model_path` is loaded once per worker group (in the
teachers' own pool, or beside the actor on the trainer's devices) in the compute dtype, sharded with the
reference's `fsdp_config` and offloaded between calls when that config offloads parameters.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from rlpost import keys
from rlpost.algos.distillation import merge_topk, mix_teacher_log_probs
from rlpost.protocol import DataProto
from rlpost.single_controller.base import Dispatch, register
from rlpost.engine.fsdp import compute_dtype, to_dtype
from rlpost.utils.model import load_for_sharding
from rlpost.utils.profiler import phase
from rlpost.workers.actor import DataParallelPPOActor
from rlpost.workers.fsdp_workers import _FSDPRole, _on_device, _to_cpu


def teacher_model_config(model_cfg: Any, model_path: str) -> Any:
    """The policy's `model` group pointed at a teacher folder: no adapters, overrides or checkpointing (the
    teacher is frozen and never runs a backward)."""
    return dataclasses.replace(model_cfg, path=model_path, hf_config_path=None, tokenizer_path=None,
                               override_config={}, lora_rank=0, lora_adapter_path=None, use_shm=False,
                               enable_gradient_checkpointing=False, enable_activation_offload=False)


def rows_of_teacher(values: np.ndarray | None, teacher_keys: dict[str, str | None]) -> dict[str, np.ndarray]:
    """{teacher name: bool (B,) mask of the rows it scores}: teachers with key null score every row; otherwise
    each teacher the rows whose `teacher_key` value equals its key.

    Raises:
        ValueError: a row no teacher scores (its value and the teachers' keys named).
    """
    n = 0 if values is None else len(values)
    if all(key is None for key in teacher_keys.values()):  # every teacher scores every row (a weighted mixture)
        return {name: np.ones(n, dtype=bool) for name in teacher_keys}
    masks = {name: np.asarray([v == key for v in values], dtype=bool) for name, key in teacher_keys.items()}
    covered = np.any(np.stack(list(masks.values())), axis=0) if masks else np.zeros(n, dtype=bool)
    if not covered.all():
        missing = values[~covered][0]
        raise ValueError(f"a row's teacher key value {missing!r} matches no distillation.teacher_models.<name>.key "
                         f"(keys: {sorted(str(k) for k in teacher_keys.values())}); add a teacher with key "
                         f"{missing!r} or filter the data")
    return masks


class TeacherWorker(_FSDPRole):
    """Frozen teacher models scoring the responses in the batch.

    Args:
        config: the typed `distillation` group.
        arr_config: the typed `actor_rollout_ref` group (the policy's model settings and the reference's
            `fsdp_config` and log-prob micro-batching, which the teachers use).
    """

    def __init__(self, config: Any, arr_config: Any) -> None:
        super().__init__(timeout_s=float(arr_config.nccl_timeout))
        self.config, self.arr = config, arr_config
        self.teachers: dict[str, DataParallelPPOActor] = {}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load, shard and (with `ref.fsdp_config.param_offload`) offload every teacher."""
        from rlpost.utils.tokenizer import auto_tokenizer

        fsdp_cfg = self.arr.ref.fsdp_config
        dtype = to_dtype(fsdp_cfg.model_dtype)
        if dtype == torch.float32:  # frozen: no float32 master copy needed
            dtype = compute_dtype(self.device, fsdp_cfg.mixed_precision.param_dtype)
        model = self.arr.model
        self.tokenizer = auto_tokenizer().from_pretrained(model.tokenizer_path or model.path,
                                                         trust_remote_code=bool(model.trust_remote_code))
        for name, teacher in self.config.teachers().items():
            module, full_state = load_for_sharding(teacher_model_config(model, teacher.model_path), dtype,
                                                   offload_policy=fsdp_cfg.offload_policy)
            self._shard(module, fsdp_cfg, trainable=False, full_state=full_state)
            del full_state
            self.teachers[name] = DataParallelPPOActor(self.arr.ref, module, None, bool(model.use_remove_padding),
                                                       use_fused_kernels=bool(model.use_fused_kernels))
            self._offload(module, None, fsdp_cfg)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @phase("teacher")
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """Reads `input_ids`, `attention_mask`, `position_ids`, `responses` and the `teacher_key` field; writes
        `teacher_log_probs` (B, R): each row's sampled tokens under its teacher.

        Every teacher runs on all of this rank's rows (the forward's collectives then match across ranks
        whatever the rows' teachers); each row keeps its own teacher's values, or the weighted mixture of the
        teachers when none has a key (`rlpost.algos.distillation.mix_teacher_log_probs`).
        """
        fsdp_cfg = self.arr.ref.fsdp_config
        self._log_prob_meta(data)
        teacher_keys = {name: t.key for name, t in self.config.teachers().items()}
        masks = rows_of_teacher(data.non_tensor_batch.get(self.config.teacher_key), teacher_keys)
        per_teacher = {}
        for name, actor in self.teachers.items():
            self._onload(actor.module, None, fsdp_cfg)
            per_teacher[name], _ = actor.compute_log_prob(_on_device(data, self.device), calculate_entropy=False)
            self._offload(actor.module, None, fsdp_cfg)
        weights = {name: t.weight for name, t in self.config.teachers().items()}
        out = mix_teacher_log_probs(per_teacher, {n: torch.as_tensor(m) for n, m in masks.items()}, weights)
        return DataProto.from_dict(tensors=_to_cpu({keys.TEACHER_LOG_PROBS: out}))

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @phase("teacher")
    def compute_teacher_topk(self, data: DataProto) -> DataProto:
        """Top-k distillation. Reads `compute_teacher_log_prob`'s keys and `student_topk_ids` (B, R, k); writes
        `teacher_log_probs` (B, R), `teacher_topk_ids` / `teacher_topk_log_probs` (B, R, 2k): the row's teacher's
        log-probs of the union of the student's top-k and its own (`rlpost.algos.distillation.merge_topk`), and
        `teacher_own_topk_ids` (B, R, k). Each row gets its own teacher's values (start-up refuses several
        teachers without a key in a top-k mode)."""
        fsdp_cfg = self.arr.ref.fsdp_config
        self._log_prob_meta(data)
        k = int(self.config.distillation_loss.topk)
        masks = rows_of_teacher(data.non_tensor_batch.get(self.config.teacher_key),
                                {name: t.key for name, t in self.config.teachers().items()})
        student_ids = data.batch[keys.STUDENT_TOPK_IDS]
        out: dict[str, torch.Tensor] = {}
        for name, actor in self.teachers.items():
            self._onload(actor.module, None, fsdp_cfg)
            got = actor.compute_topk(_on_device(data, self.device), k, student_ids.to(self.device))
            self._offload(actor.module, None, fsdp_cfg)
            got = {n: v.cpu() for n, v in got.items()}
            log_probs, ids = merge_topk(got["at_ids"], student_ids, got["topk_log_probs"], got["topk_ids"])
            mine = {keys.TEACHER_LOG_PROBS: got[keys.OLD_LOG_PROBS], keys.TEACHER_TOPK_LOG_PROBS: log_probs,
                    keys.TEACHER_TOPK_IDS: ids, keys.TEACHER_OWN_TOPK_IDS: got["topk_ids"]}
            rows = torch.as_tensor(masks[name])
            for key, value in mine.items():
                keep = rows.view(-1, *([1] * (value.dim() - 1)))
                out[key] = value if key not in out else torch.where(keep, value, out[key])
        return DataProto.from_dict(tensors=_to_cpu(out))

    def _log_prob_meta(self, data: DataProto) -> None:
        """The reference's log-prob micro-batching and the rollout temperature into `data.meta_info`."""
        ref, meta = self.arr.ref, data.meta_info
        meta.setdefault(keys.META_TEMPERATURE, float(self.arr.rollout.temperature))
        meta["micro_batch_size"] = ref.log_prob_micro_batch_size_per_gpu
        meta["use_dynamic_bsz"] = bool(ref.log_prob_use_dynamic_bsz)
        meta["max_token_len"] = int(ref.log_prob_max_token_len_per_gpu)
