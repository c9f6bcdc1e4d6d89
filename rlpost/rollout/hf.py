"""HF rollout: `generate` on the actor's own module - the slow reference path, no extra engine.

Because it generates with the very module the actor trains, `update_weights` is a no-op and
`sleep`/`wake_up` have nothing to release.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import torch

from rlpost import keys
from rlpost.protocol import DataProto
from rlpost.rollout import ROLLOUT_REGISTRY
from rlpost.rollout.base import BaseRollout, SamplingSpec, resolve_sampling
from rlpost.rollout.utils import assemble_output, eos_id_set

logger = logging.getLogger(__name__)


def _distributed_world() -> int:
    """World size when torch.distributed is initialised (imported only here, where it is used)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _generate_kwargs(spec: SamplingSpec, eos_ids: set[int], pad_id: int) -> dict[str, Any]:
    """transformers `generate` arguments; top_k <= 0 means off (HF: 0)."""
    kwargs: dict[str, Any] = {
        "max_new_tokens": spec.max_tokens,
        "eos_token_id": None if spec.ignore_eos or not eos_ids else sorted(eos_ids),
        "pad_token_id": pad_id,
        "return_dict_in_generate": True,
        "output_scores": spec.logprobs,
        "use_cache": True,
        # FSDP: every rank must run the same number of forward steps (all-gathers inside each one)
        "synced_gpus": _distributed_world() > 1,
    }
    if spec.greedy:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kwargs.update(do_sample=True, temperature=spec.temperature, top_k=max(spec.top_k, 0), top_p=spec.top_p)
    return kwargs


@ROLLOUT_REGISTRY.register("hf")
class HFRollout(BaseRollout):
    """Generates with `module.generate` (module may be FSDP2-wrapped). Without a module, loads one from
    `model_path` (standalone use and tests)."""

    def __init__(
        self, config: Any, model_path: str, tokenizer: Any, device: str, module: torch.nn.Module | None = None
    ) -> None:
        self.config, self.tokenizer, self.device = config, tokenizer, device
        if module is None:
            from transformers import AutoModelForCausalLM

            module = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).to(device)
        self.module = module

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """See `BaseRollout.generate_sequences`. Log-probs (if asked) come from the processed scores:
        log_softmax of the logits after temperature/top-k/top-p, at the sampled token."""
        spec = resolve_sampling(self.config, prompts.meta_info)
        eos_ids = eos_id_set(prompts.meta_info.get(keys.META_EOS_TOKEN_ID))
        pad_id = int(prompts.meta_info.get(keys.META_PAD_TOKEN_ID) or 0)
        idx = prompts.batch[keys.INPUT_IDS].to(self.device)
        attn = prompts.batch[keys.ATTENTION_MASK].to(self.device)
        was_training = self.module.training
        self.module.eval()
        try:
            out = self.module.generate(input_ids=idx, attention_mask=attn, **_generate_kwargs(spec, eos_ids, pad_id))
        finally:
            self.module.train(was_training)
        gen = out.sequences[:, idx.shape[1] :].cpu()  # (B, L), L <= R
        log_probs = None
        if spec.logprobs:
            scores = torch.stack(out.scores, dim=1).float().cpu()  # (B, L, V)
            log_probs = torch.log_softmax(scores, dim=-1).gather(-1, gen.unsqueeze(-1)).squeeze(-1)
        responses, lps = [], []
        for i, row in enumerate(gen.tolist()):
            n = len(row)
            if not spec.ignore_eos:  # rows that finished early are padded by generate: cut after EOS
                n = next((j + 1 for j, t in enumerate(row) if t in eos_ids), n)
            responses.append(row[:n])
            if log_probs is not None:
                lps.append(log_probs[i, :n].tolist())
        return assemble_output(prompts, responses, spec.max_tokens, lps if log_probs is not None else None)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """No-op: the engine IS the actor's module, so it always has the current weights. The iterator is
        not consumed (callers need not gather anything for this engine)."""
        self.last_sync_s = 0.0
