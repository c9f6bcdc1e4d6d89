"""Trainer metrics on a DataProto stand-in, checked against hand-computed values."""

from types import SimpleNamespace

import pytest
import torch

from rlpost import keys
from rlpost.trainer.ppo import metric_utils as mu


def _batch(meta=None):
    # B = 2, P = 3, R = 2. Prompt lengths 2 and 3 (P = 3); response lengths 2 (R = 2) and 1.
    tensors = {
        keys.RESPONSES: torch.tensor([[5, 6], [7, 0]]),
        keys.ATTENTION_MASK: torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]]),
        keys.RESPONSE_MASK: torch.tensor([[1, 1], [1, 0]]),
        keys.TOKEN_LEVEL_SCORES: torch.tensor([[0.0, 1.0], [0.5, 0.0]]),
        keys.TOKEN_LEVEL_REWARDS: torch.tensor([[0.0, 0.8], [0.3, 0.0]]),
        keys.ADVANTAGES: torch.tensor([[1.0, 2.0], [3.0, 99.0]]),
        keys.RETURNS: torch.tensor([[1.0, 1.0], [2.0, 50.0]]),
        keys.VALUES: torch.tensor([[0.5, 1.0], [1.5, 7.0]]),
    }
    return SimpleNamespace(batch=tensors, non_tensor_batch={}, meta_info=meta or {})


def test_compute_data_metrics_with_critic():
    m = mu.compute_data_metrics(_batch(), use_critic=True)
    expected = {
        "critic/score/mean": 0.75, "critic/score/max": 1.0, "critic/score/min": 0.5,
        "critic/rewards/mean": 0.55, "critic/rewards/max": 0.8, "critic/rewards/min": 0.3,
        "critic/advantages/mean": 2.0, "critic/advantages/max": 3.0, "critic/advantages/min": 1.0,
        "critic/returns/mean": 4 / 3, "critic/returns/max": 2.0, "critic/returns/min": 1.0,
        "critic/values/mean": 1.0, "critic/values/max": 1.5, "critic/values/min": 0.5,
        "response_length/mean": 1.5, "response_length/max": 2.0, "response_length/min": 1.0,
        "response_length/clip_ratio": 0.5,
        "prompt_length/mean": 2.5, "prompt_length/max": 3.0, "prompt_length/min": 2.0,
        "prompt_length/clip_ratio": 0.5,
    }
    # returns - values on valid tokens = [0.5, 0, 0.5]: unbiased var 1/12; var(returns [1, 1, 2]) = 1/3
    expected["critic/vf_explained_var"] = 1.0 - (1 / 12) / (1 / 3 + 1e-5)
    assert m.keys() == expected.keys()
    for k, v in expected.items():
        assert m[k] == pytest.approx(v, abs=1e-5), k


def test_multi_turn_rows_add_multi_turn_metrics_and_count_tool_tokens_in_lengths():
    """Row 0: model token, tool token (response_mask 0), model token -> response length 3 (= R: clipped).
    Per-row counters of the agent loops become the multi_turn/* metrics (means, max, batch totals)."""
    import numpy as np

    batch = _batch()
    batch.batch[keys.RESPONSES] = torch.tensor([[5, 6, 7], [7, 0, 0]])
    batch.batch[keys.ATTENTION_MASK] = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    batch.batch[keys.RESPONSE_MASK] = torch.tensor([[1, 0, 1], [1, 0, 0]])
    for k in (keys.TOKEN_LEVEL_SCORES, keys.TOKEN_LEVEL_REWARDS, keys.ADVANTAGES, keys.RETURNS, keys.VALUES):
        batch.batch[k] = torch.cat([batch.batch[k], torch.zeros(2, 1)], dim=1)
    stats = np.empty(2, dtype=object)
    stats[:] = [{"tool_calls": 2.0, "tool_errors": 1.0, "bad_tool_calls": 0.0, "interaction_turns": 1.0,
                 "truncated": 1.0, "tokenization_mismatch": 0.0},
                {"tool_calls": 0.0, "tool_errors": 0.0, "bad_tool_calls": 3.0, "interaction_turns": 0.0,
                 "truncated": 0.0, "tokenization_mismatch": 1.0}]
    batch.non_tensor_batch = {keys.NUM_TURNS: np.array([5, 2]), keys.AGENT_METRICS: stats}
    m = mu.compute_data_metrics(batch, use_critic=False)
    assert m["response_length/max"] == 3.0 and m["response_length/clip_ratio"] == 0.5
    assert {k: v for k, v in m.items() if k.startswith("multi_turn/")} == pytest.approx({
        "multi_turn/num_turns/mean": 3.5, "multi_turn/num_turns/max": 5.0, "multi_turn/tool_calls/mean": 1.0,
        "multi_turn/tool_call_frac": 0.5, "multi_turn/interaction_turns/mean": 0.5, "multi_turn/tool_errors": 1.0, "multi_turn/bad_tool_calls": 3.0,
        "multi_turn/truncated_frac": 0.5, "multi_turn/tokenization_mismatch_frac": 0.5})


def test_compute_data_metrics_without_critic():
    m = mu.compute_data_metrics(_batch(), use_critic=False)
    assert not any(k.startswith("critic/values") for k in m) and "critic/vf_explained_var" not in m
    assert m["critic/advantages/max"] == pytest.approx(3.0)


def test_timing_metrics():
    m = mu.compute_timing_metrics(_batch(), {"gen": 0.3, "update_actor": 0.7, "step": 2.0})
    # response tokens 2 + 1 = 3; all tokens 3 + (2 + 3) = 8
    assert m == pytest.approx({
        "timing_s/gen": 0.3, "timing_s/update_actor": 0.7, "timing_s/step": 2.0,
        "timing_per_token_ms/gen": 300 / 3, "timing_per_token_ms/update_actor": 700 / 8,
    })


def test_throughput_metrics():
    m = mu.compute_throughout_metrics(_batch({keys.META_GLOBAL_TOKEN_NUM: [10, 6]}), {"step": 2.0}, n_gpus=2)
    assert m == pytest.approx({"perf/total_num_tokens": 16.0, "perf/time_per_step": 2.0, "perf/throughput": 4.0})
    m = mu.compute_throughout_metrics(_batch(), {"step": 2.0}, n_gpus=1)  # falls back to attention_mask: 8
    assert m["perf/total_num_tokens"] == 8.0 and m["perf/throughput"] == pytest.approx(4.0)


def test_process_validation_metrics_as_verl_shapes_them():
    sources = ["gsm", "gsm", "gsm", "gsm", "math"]
    uids = ["p1", "p1", "p2", "p2", "p3"]
    infos = {"reward": [1.0, 0.0, 1.0, 1.0, 0.5], "acc": [1, 0, 0, 1, 1], "pred": ["7", "8", "7", "7", "x"]}
    nested = mu.process_validation_metrics(sources, uids, infos)
    gsm = nested["gsm"]["reward"]
    assert gsm["mean@2"] == pytest.approx(0.75) and gsm["std@2"] == pytest.approx((0.5 + 0.0) / 2)
    # best@2 by bootstrap: p1 ([1, 0]) draws a 1 in 3 of 4 pairs, p2 ([1, 1]) always: (0.75 + 1) / 2
    assert gsm["best@2/mean"] == pytest.approx(0.875, abs=0.03)
    assert gsm["worst@2/mean"] == pytest.approx((0.25 + 1) / 2, abs=0.03)
    # maj@2: p2 always votes 7 (1.0); p1's pairs (7,7) 1, (8,8) 0, and a tie goes to the first drawn: 0.5
    assert gsm["maj@2/mean"] == pytest.approx(0.75, abs=0.03)
    assert "pred" not in nested["gsm"]  # text: voted on, not averaged
    assert nested["math"]["reward"] == {"mean@1": 0.5}
    flat = mu.validation_metric_dict(nested)
    # with an "acc" variable it is the core one (verl's rule), at the largest n only, its mean/maj/best
    assert flat["val-core/gsm/acc/mean@2"] == pytest.approx(0.5) and "val-core/gsm/reward/mean@2" not in flat
    assert flat["val-aux/gsm/reward/mean@2"] == pytest.approx(0.75) and "val-aux/gsm/acc/std@2" in flat
    assert "val-core/gsm/acc/worst@2/mean" not in flat and "val-core/gsm/acc/best@2/mean" in flat
    plain = mu.validation_metric_dict(mu.process_validation_metrics(sources, range(5), {"reward": infos["reward"]}))
    assert plain == pytest.approx({"val-core/gsm/reward/mean@1": 0.75, "val-core/math/reward/mean@1": 0.5})
    with pytest.raises(ValueError, match="'reward' has 4 values for 5 samples"):
        mu.process_validation_metrics(sources, uids, {"reward": [1.0] * 4})
    assert mu.calc_maj_val([{"p": "A", "v": 0.9}, {"p": "B", "v": 0.8}, {"p": "A", "v": 0.7}], "p", "v") == 0.9



def test_gen_parts_come_from_the_slowest_rank_and_add_up_over_generation_batches():
    from rlpost.trainer.ppo.metric_utils import add_gen_parts

    timing: dict[str, float] = {}
    ranks = {"timing_s/generate_sequences": [3.0, 5.0], "timing_s/gen_wake": [0.5, 0.1],
             "timing_s/gen_engine": [2.0, 4.5], "timing_s/gen_sleep": [0.4, 0.3]}
    add_gen_parts(timing, ranks)  # rank 1 took longest: its parts, not each part's maximum over ranks
    assert timing == {"gen_wake": 0.1, "gen_engine": 4.5, "gen_sleep": 0.3}
    add_gen_parts(timing, ranks)  # a second generation batch of the same step (dynamic sampling)
    assert timing == {"gen_wake": 0.2, "gen_engine": 9.0, "gen_sleep": 0.6}
    add_gen_parts(timing, {})  # a rollout that reports no parts leaves them alone
    assert timing["gen_engine"] == 9.0
