"""HF rollout: `generate` on the actor's own module - the slow reference path, no extra engine.

Because it generates with the very module the actor trains, `update_weights` is a no-op and
`sleep`/`wake_up` have nothing to release. A rollout-only worker (split placement) loads a module of its own
and copies the weights it receives into it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Iterable

import torch

from rlpost import keys
from rlpost.protocol import DataProto
from rlpost.rollout import ROLLOUT_REGISTRY
from rlpost.rollout.async_engine import BatchedEngine, Completion
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
    `model_path` (standalone use and tests). A LoRA actor's module holds its adapter already: `lora_rank` and
    `load_adapter` change nothing."""

    def __init__(
        self, config: Any, model_path: str, tokenizer: Any, device: str, module: torch.nn.Module | None = None,
        lora_rank: int = 0,
    ) -> None:
        self.config, self.tokenizer, self.device = config, tokenizer, device
        self.owns_module = module is None  # a rollout-only worker: weights arrive by `update_weights`
        if module is None:
            from transformers import AutoModelForCausalLM

            module = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).to(device)
        self.module = module

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, attn: torch.Tensor, spec: SamplingSpec, eos_ids: set[int],
                 pad_id: int) -> list[Completion]:
        """`module.generate` on left-padded prompts (B, P); per row the generated ids, cut after the first EOS
        (unless ignore_eos), and their log-probs when `spec.logprobs`: log_softmax of the processed scores
        (after temperature/top-k/top-p) at the sampled token."""
        was_training = self.module.training
        self.module.eval()
        try:
            out = self.module.generate(input_ids=idx.to(self.device), attention_mask=attn.to(self.device),
                                       **_generate_kwargs(spec, eos_ids, pad_id))
        finally:
            self.module.train(was_training)
        gen = out.sequences[:, idx.shape[1] :].cpu()  # (B, L), L <= max_tokens
        log_probs = None
        if spec.logprobs:
            scores = torch.stack(out.scores, dim=1).float().cpu()  # (B, L, V)
            log_probs = torch.log_softmax(scores, dim=-1).gather(-1, gen.unsqueeze(-1)).squeeze(-1)
        completions = []
        for i, row in enumerate(gen.tolist()):
            n = len(row)
            if not spec.ignore_eos:  # rows that finished early are padded by generate: cut after EOS
                n = next((j + 1 for j, t in enumerate(row) if t in eos_ids), n)
            completions.append((row[:n], None if log_probs is None else log_probs[i, :n].tolist()))
        return completions

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """See `BaseRollout.generate_sequences`."""
        spec = resolve_sampling(self.config, prompts.meta_info)
        eos_ids = eos_id_set(prompts.meta_info.get(keys.META_EOS_TOKEN_ID))
        pad_id = int(prompts.meta_info.get(keys.META_PAD_TOKEN_ID) or 0)
        completions = self.generate(prompts.batch[keys.INPUT_IDS], prompts.batch[keys.ATTENTION_MASK], spec,
                                    eos_ids, pad_id)
        log_probs = [lp for _, lp in completions] if spec.logprobs else None
        return assemble_output(prompts, [ids for ids, _ in completions], spec.max_tokens, log_probs)

    def agent_engine(self, stop_ids: set[int]) -> HFBatchEngine:
        """Batched `generate` for the agent loops (see `HFBatchEngine`)."""
        return HFBatchEngine(self, stop_ids)

    def load_adapter(self, path: str) -> None:
        """No-op: the module generating is the actor's, adapter included."""

    def load_adapter_tensors(self, tensors: dict[str, torch.Tensor], peft_config: Any) -> bool:
        """No-op, as `load_adapter` (no folder is written for it either)."""
        return True

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """With the actor's module: a no-op (the engine IS that module, always current; the iterator is not
        consumed). With a module of its own (a rollout-only worker): copy every tensor in by HF name."""
        self.last_sync_s = 0.0
        if not self.owns_module:
            return
        start = time.perf_counter()
        state = self.module.state_dict()
        with torch.no_grad():
            for name, tensor in named_tensors:
                state[name].copy_(tensor)
        self.last_sync_s = time.perf_counter() - start


class HFBatchEngine(BatchedEngine):
    """The slow fallback for multi-turn rollouts: the requests pending at one moment are left-padded into one
    `generate` call. With FSDP over several ranks every forward pass is a collective, so the ranks agree
    before each batch whether any of them has work (`_sync_round`); ranks without work run a one-token dummy
    request in that batch, until no rank has work left (`close`)."""

    def __init__(self, rollout: HFRollout, stop_ids: set[int]) -> None:
        super().__init__()
        self.rollout, self.stop_ids = rollout, stop_ids
        self.pad_id = int(rollout.tokenizer.pad_token_id if rollout.tokenizer.pad_token_id is not None else 0)
        self.distributed = _distributed_world() > 1
        self._idle_spec: SamplingSpec | None = None

    def _generate_batch(self, prompts: list[list[int]], spec: SamplingSpec) -> list[Completion]:
        self._idle_spec = dataclasses.replace(spec, max_tokens=1)
        width = max(len(p) for p in prompts)
        idx = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], dtype=torch.long)
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
        return self.rollout.generate(idx, attn, spec, self.stop_ids, self.pad_id)

    def _sync_round(self, has_work: bool) -> bool:
        if not self.distributed:
            return has_work
        import torch.distributed as dist

        flag = torch.tensor([int(has_work)], device=self.rollout.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _idle_round(self) -> None:
        spec = self._idle_spec or SamplingSpec(greedy=True, temperature=0.0, top_k=-1, top_p=1.0, max_tokens=1,
                                               ignore_eos=False, logprobs=False)
        self.rollout.generate(torch.tensor([[self.pad_id]]), torch.ones(1, 1, dtype=torch.long), spec,
                              self.stop_ids, self.pad_id)
