"""The strong bare loops: packing by hand, packed log-probs equal to each sequence run alone, a real update."""

from __future__ import annotations

import torch

from benchmarks import strong_limits


def test_pack_first_fit_positions_and_scored_tokens() -> None:
    seqs = [([1, 2], [3, 4, 5]), ([6], [7]), ([8, 9, 10], [11, 12, 13, 14])]
    rows = strong_limits.pack(seqs, max_tokens=8, device="cpu")
    # Longest first: 7 tokens open row 0, 5 do not fit beside them (12 > 8) and open row 1, 2 join row 1 (7).
    assert [r.ids[0].tolist() for r in rows] == [[8, 9, 10, 11, 12, 13, 14], [1, 2, 3, 4, 5, 6, 7]]
    row = rows[1]
    assert row.positions[0].tolist() == [0, 1, 2, 3, 4, 0, 1]
    assert row.where.tolist() == [1, 2, 3, 5] and row.labels.tolist() == [3, 4, 5, 7]
    assert all(r.ids.shape[1] <= 8 for r in rows)
    assert strong_limits.pack([([1] * 5, [2] * 6)], max_tokens=4, device="cpu")[0].ids.shape == (1, 11)


def test_packed_log_probs_equal_each_sequence_alone_and_train_steps(tiny_model_dir) -> None:
    model, applied = strong_limits.load_model(tiny_model_dir, "cpu", grad_ckpt=False)
    assert applied == {"liger": False, "grad_ckpt": False, "dtype": "bfloat16", "attention": "packed"}
    g = torch.Generator().manual_seed(0)
    seqs = [(torch.randint(5, 200, (p,), generator=g).tolist(), torch.randint(5, 200, (r,), generator=g).tolist())
            for p, r in ((4, 6), (7, 3), (2, 9))]
    rows = strong_limits.pack(seqs, max_tokens=64, device="cpu")
    assert len(rows) == 1
    opts = strong_limits._head_opts(True, "cpu")
    with torch.no_grad():
        got = strong_limits.row_log_probs(model, rows[0], opts)[:, 0]
        want = []
        for prompt, response in sorted(seqs, key=lambda s: -(len(s[0]) + len(s[1]))):  # pack's order
            ids = torch.tensor(prompt + response)[None]
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
            want += [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(response)]
    assert got.shape == (18,)
    assert torch.allclose(got, torch.tensor(want), atol=0.05), (got - torch.tensor(want)).abs().max()
    assert strong_limits.forward_pass(model, rows) == 18
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    strong_limits.train_pass(model, opt, rows, [torch.ones(18)])
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    assert strong_limits.mfu(6, 10, 100, 2.0, peak=1000.0) == 3.0
