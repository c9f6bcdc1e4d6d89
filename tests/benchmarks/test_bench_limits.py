"""bench_limits' bare loops on a tiny CPU model: the forward builds no graph, the training pass moves weights
with one optimizer step per mini-batch, and both timed wrappers report their tokens."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_limits  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=100, max_position_embeddings=64)
    return Qwen2ForCausalLM(cfg)


def test_forward_pass_builds_no_graph_and_train_pass_steps_per_mini_batch(monkeypatch):
    model = _model()
    ids = torch.randint(0, 100, (6, 10))
    graphs = []
    real = bench_limits.response_log_probs

    def recording(*args):
        out = real(*args)
        graphs.append(out.grad_fn is not None)
        return out

    monkeypatch.setattr(bench_limits, "response_log_probs", recording)
    bench_limits.forward_pass(model, ids, prompt_len=4, micro=4)
    assert graphs == [False, False]  # two micro-batches, no autograd graph
    steps = []
    opt = bench_limits.adamw(model)
    opt.register_step_post_hook(lambda *_: steps.append(1))
    before = [p.detach().clone() for p in model.parameters()]
    bench_limits.train_pass(model, opt, torch.randn(6), ids, prompt_len=4, micro=2, mini=4)
    assert len(steps) == 2 and graphs[2:] == [True] * 3  # mini-batches of rows 0-3 and 4-5; 3 micro-batches
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())  # zeroed after each step


def test_timed_wrappers_report_all_tokens():
    model = _model()
    ids = torch.randint(0, 100, (4, 10))
    for res in (bench_limits.bare_forward(model, ids, 4, 2), bench_limits.bare_train(model, ids, 4, 2, 4)):
        assert res["s"] > 0 and res["tokens"] == 40 and res["tokens_per_s"] == pytest.approx(40 / res["s"])


def test_a_model_of_another_architecture_is_refused_by_name(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(bench_limits.ARCHS["0.5b"]))
    bench_limits.check_arch(tmp_path, "0.5b")  # the matching architecture passes
    with pytest.raises(SystemExit, match="is not the 7b architecture .*'hidden_size': \\(896, 3584\\)"):
        bench_limits.check_arch(tmp_path, "7b")
