"""vLLM normalises a vision-language model's pixels on the device with buffers computed from the processor config
(not checkpoint weights): an engine started with `load_format=dummy` (rlpost's colocated engines) holds random ones
until `restore_image_normalization` sets them back, as every weight sync does. Checked against the processor's own
rescale factor, mean and std."""

import pytest
import torch

pytestmark = pytest.mark.timeout(240)


def test_dummy_loaded_engine_gets_the_processors_normalization(tiny_vl_model_dir):
    from rlpost.utils.vl_processor import inspect_vllm_models_in_process

    inspect_vllm_models_in_process()
    from vllm import LLM

    from rlpost.rollout.vllm import restore_image_normalization

    from rlpost.utils.tokenizer import hf_processor

    image = hf_processor(tiny_vl_model_dir).image_processor
    mean, std = torch.tensor(image.image_mean), torch.tensor(image.image_std)
    want = torch.stack([image.rescale_factor / std, -mean / std])
    llm = LLM(model=tiny_vl_model_dir, load_format="dummy", dtype="bfloat16", max_model_len=64, enforce_eager=True,
              limit_mm_per_prompt={"video": 0}, gpu_memory_utilization=0.3)

    def buffers(worker):
        from vllm.model_executor.layers.fusion.mm_input_norm import FusedMMInputNorm

        norms = [m for m in worker.model_runner.model.modules() if isinstance(m, FusedMMInputNorm)]
        return [torch.stack([m.weight.float().cpu(), m.bias.float().cpu()]) for m in norms]

    before = llm.collective_rpc(buffers)[0]
    assert before and not torch.allclose(before[0], want, atol=1e-3)  # dummy values: pictures would be distorted
    assert llm.collective_rpc(lambda w: restore_image_normalization(w.model_runner))[0] == len(before)
    for got in llm.collective_rpc(buffers)[0]:
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
