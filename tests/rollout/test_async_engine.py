"""The agent-loop fronts of the engines: vLLM continuous batching (requests join the running batch as they
arrive) and the HF batched fallback give the engine's own greedy tokens and log-probs; the engine-neutral
stepping loop resolves, fails and cancels requests correctly."""

import asyncio

import pytest
import torch

from _compose import SMALL, compose_config
from rlpost.rollout.async_engine import BatchedEngine, SteppedEngine, sampling_kwargs, spec_of
from rlpost.rollout.base import SamplingSpec

GREEDY = SamplingSpec(greedy=True, temperature=0.0, top_k=-1, top_p=1.0, max_tokens=8, ignore_eos=False,
                      logprobs=True)
PROMPTS = [[5, 6, 7, 8, 9], [9, 10, 11], [12, 13, 14, 15, 16, 17, 18], [20, 21], [30, 31, 32, 33]]


def params(max_tokens: int, spec: SamplingSpec = GREEDY) -> dict:
    return {**sampling_kwargs(spec), "max_tokens": max_tokens}


# --- engine-neutral behaviour on a scripted engine ---------------------------------------------------------
class ScriptedEngine(SteppedEngine):
    """Each request finishes after `len(prompt)` steps and returns its prompt reversed."""

    def __init__(self, fail_at_step: int | None = None):
        super().__init__()
        self.running, self.steps, self.aborted, self.fail_at_step = {}, 0, [], fail_at_step
        self.batch_sizes = []

    def _add(self, request_id, prompt_ids, spec):
        self.running[request_id] = [len(prompt_ids), prompt_ids[::-1][: spec.max_tokens]]

    def _step(self):
        self.steps += 1
        if self.steps == self.fail_at_step:
            raise RuntimeError("engine died")
        self.batch_sizes.append(len(self.running))
        done = []
        for rid, state in list(self.running.items()):
            state[0] -= 1
            if state[0] == 0:
                done.append((rid, state[1], [0.0] * len(state[1])))
                del self.running[rid]
        return done

    def _abort(self, request_ids):
        self.aborted += request_ids
        for rid in request_ids:
            self.running.pop(rid, None)


def test_requests_join_the_running_batch_as_they_arrive():
    engine = ScriptedEngine()

    async def chain():  # a short request, then (after its "tool") a second one while the long one runs
        first = await engine.generate([1, 2], params(8))
        await asyncio.sleep(0)
        second = await engine.generate([3, 4], params(8))
        return first, second

    async def main():
        return await asyncio.gather(engine.generate([9] * 8, params(8)), chain())

    long, (first, second) = asyncio.run(main())
    assert long[0] == [9] * 8 and first[0] == [2, 1] and second[0] == [4, 3]
    # the second request ran alongside the long one (8 steps in all, not 8 + 2): it joined the running batch
    assert engine.steps == 8 and engine.max_in_flight == 2
    assert engine.batch_sizes.count(2) == 4  # two steps with the first short request, two with the second


def test_engine_error_reaches_every_waiting_request_and_cancel_aborts():
    engine = ScriptedEngine(fail_at_step=2)

    async def main():
        return await asyncio.gather(engine.generate([1] * 5, params(8)), engine.generate([2] * 5, params(8)),
                                    return_exceptions=True)

    results = asyncio.run(main())
    assert all(isinstance(r, RuntimeError) and str(r) == "engine died" for r in results)

    engine = ScriptedEngine()

    async def cancelled():
        task = asyncio.ensure_future(engine.generate([1] * 50, params(8)))
        for _ in range(5):  # a few engine steps, far fewer than the 50 the request needs
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(cancelled())
    assert engine.aborted == ["agent-0"] and engine.running == {}


def test_zero_budget_and_sampling_params_round_trip():
    engine = ScriptedEngine()
    assert asyncio.run(engine.generate([1, 2], params(0))) == ([], [])
    assert spec_of(params(8)) == GREEDY
    with pytest.raises(KeyError, match="sampling_kwargs"):
        spec_of({"max_tokens": 3})


class EchoBatches(BatchedEngine):
    def _generate_batch(self, prompts, spec):
        return [(p * spec.max_tokens, None) for p in prompts]


def test_batched_engine_groups_pending_requests_and_cuts_to_each_budget():
    engine = EchoBatches()

    async def main():
        return await asyncio.gather(*(engine.generate([i], params(i + 1)) for i in range(4)))

    assert asyncio.run(main()) == [([0], None), ([1, 1], None), ([2, 2, 2], None), ([3] * 4, None)]
    assert engine.batch_sizes == [4]
    other = SamplingSpec(**{**sampling_kwargs(GREEDY), "temperature": 1.0, "greedy": False})
    with pytest.raises(ValueError, match="share their sampling settings"):
        asyncio.run(engine.generate([1], params(2, other)))


# --- the real engines ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    """The vLLM rollout (fp32, synced from a perturbed HF model so greedy outputs vary) and the HF rollout on
    that same HF model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlpost.rollout import build_rollout

    tok = AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")
    cfg = compose_config(*SMALL, "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=float32",
                         "data.max_prompt_length=32", "data.max_response_length=16",
                         "actor_rollout_ref.rollout.calculate_log_probs=true").actor_rollout_ref.rollout
    vllm_rollout = build_rollout(cfg, tiny_model_dir, tok, "cpu")
    actor = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    vllm_rollout.update_weights(actor.named_parameters())
    hf_cfg = compose_config(*SMALL, "actor_rollout_ref.rollout.name=hf").actor_rollout_ref.rollout
    hf_rollout = build_rollout(hf_cfg, tiny_model_dir, tok, "cpu", module=actor)
    return vllm_rollout, hf_rollout, tok


def test_vllm_concurrent_requests_get_the_tokens_of_llm_generate(engines):
    from vllm import SamplingParams

    rollout, _, tok = engines
    stop = {tok.eos_token_id}
    direct = rollout.llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                                  SamplingParams(temperature=0.0, max_tokens=8, logprobs=0, detokenize=False,
                                                 stop_token_ids=sorted(stop)), use_tqdm=False)
    expected = [list(o.outputs[0].token_ids) for o in direct]
    assert len({tuple(e) for e in expected}) > 1  # the perturbed model answers each prompt differently
    engine = rollout.agent_engine(stop)

    async def staggered():  # the later requests arrive while the first ones are generating
        async def one(i):
            await asyncio.sleep(0.002 * i)
            return await engine.generate(PROMPTS[i], params(8))
        return await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))

    results = asyncio.run(staggered())
    assert [ids for ids, _ in results] == expected
    for (ids, lps), o in zip(results, direct):
        assert lps == pytest.approx([s[t].logprob for t, s in zip(ids, o.outputs[0].logprobs)], abs=1e-4)
    assert engine.max_in_flight > 1


def test_vllm_a_follow_up_request_finishes_before_a_long_one_started_earlier(engines):
    rollout, _, tok = engines
    engine = rollout.agent_engine({tok.eos_token_id})
    order = []

    async def long():
        out = await engine.generate(PROMPTS[0], {**params(16), "ignore_eos": True})
        order.append("long")
        return out

    async def short_then_follow_up():
        first = await engine.generate(PROMPTS[1], {**params(2), "ignore_eos": True})
        order.append("short")
        second = await engine.generate(PROMPTS[1] + first[0], {**params(2), "ignore_eos": True})
        order.append("follow-up")
        return second

    async def main():
        return await asyncio.gather(long(), short_then_follow_up())

    (long_ids, _), (follow_ids, _) = asyncio.run(main())
    assert order == ["short", "follow-up", "long"]  # the follow-up joined the batch the long request runs in
    assert len(long_ids) == 16 and len(follow_ids) == 2


def test_hf_batch_engine_matches_one_prompt_at_a_time(engines):
    _, rollout, tok = engines
    engine = rollout.agent_engine({tok.eos_token_id})

    async def main():
        return await asyncio.gather(*(engine.generate(p, params(6)) for p in PROMPTS))

    results = asyncio.run(main())
    assert engine.batch_sizes == [len(PROMPTS)]
    for prompt, (ids, lps) in zip(PROMPTS, results):
        single = rollout.generate(torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long),
                                  spec_of(params(6)), {tok.eos_token_id}, tok.pad_token_id)
        assert ids == single[0][0] and 0 < len(ids) <= 6
        assert lps == pytest.approx(single[0][1], abs=1e-4)
