"""RewardModelWorker: scores equal a plain HF forward (direct, dynamic bsz, truncated, re-templated, offloaded,
packed, packed with Ulysses SP 2) on 2 gloo ranks; pure helpers; option errors; the trainer returns rm_scores
instead of running the rule."""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _compose import SMALL, compose_config
from _fsdp_helpers import R, make_batch, spawn
from _fsdp_helpers import gather_all as _gather
from rlpost import keys
from rlpost.protocol import DataProto

# A chat template unlike the policy's ChatML, so re-templated inputs are recognisable.
RM_TEMPLATE = ("{% for m in messages %}{{ '### ' + m['role'] + ':\n' + m['content'] + '\n' }}{% endfor %}"
               "{{ '### end' }}")
ATOL = 1e-4  # fp32 on CPU: batched/padded/sharded vs single unpadded rows differ by ~1e-6


def full_config(rm_dir: str, policy_dir: str, *overrides: str):
    """Validated `ppo_trainer` config with the reward model of `rm_dir` enabled; the policy is `policy_dir`."""
    return compose_config(
        *SMALL, f"actor_rollout_ref.model.path={policy_dir}", f"critic.model.path={policy_dir}",
        "actor_rollout_ref.rollout.name=hf", "reward_model.enable=true", f"reward_model.model.path={rm_dir}",
        "reward_model.micro_batch_size_per_gpu=3", "reward_model.forward_max_token_len_per_gpu=16", *overrides)


def rm_config(rm_dir: str, input_tokenizer: str | None = None, *overrides: str):
    """The `reward_model` group; `input_tokenizer` None scores the policy's ids as they are."""
    tok = "null" if input_tokenizer is None else input_tokenizer
    return full_config(rm_dir, input_tokenizer or rm_dir, f"reward_model.model.input_tokenizer={tok}",
                       *overrides).reward_model


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """(rm_dir, policy_dir): a tiny Qwen2ForSequenceClassification with RM_TEMPLATE, and a ChatML tokenizer."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from rlpost.utils.tiny_model import build_tokenizer

    policy_dir = str(tmp_path_factory.mktemp("policy_tok"))
    build_tokenizer(policy_dir)
    rm_dir = str(tmp_path_factory.mktemp("rm"))
    tok = build_tokenizer(rm_dir)
    tok.chat_template = RM_TEMPLATE
    tok.save_pretrained(rm_dir)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, num_labels=1,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    model = Qwen2ForSequenceClassification(config)
    with torch.no_grad():
        model.score.weight.normal_(0.0, 1.0)  # O(1) scores that differ between rows
    model.save_pretrained(rm_dir)
    return rm_dir, policy_dir


def _share(batch: dict, rank: int, world: int) -> DataProto:
    n = next(iter(batch.values())).shape[0] // world
    return DataProto.from_dict(tensors={k: v[rank * n:(rank + 1) * n].clone() for k, v in batch.items()})


def _run(rank: int, rm_dir: str, policy_dir: str, vocab: int, tmp: str) -> None:
    from rlpost.workers.reward_model import RewardModelWorker

    batch, world, res = make_batch(vocab), 2, {}

    def score(w):
        return _gather(w.compute_rm_score(_share(batch, rank, world)).batch[keys.RM_SCORES])

    w = RewardModelWorker(rm_config(rm_dir))
    w.init_model()
    res["direct"] = score(w)
    w.config = w.config.replace(use_dynamic_bsz=True)
    res["dynamic"] = score(w)
    w.config = w.config.replace(use_dynamic_bsz=False, max_length=4)
    res["truncated"] = score(w)
    w2 = RewardModelWorker(rm_config(rm_dir, policy_dir, "reward_model.model.fsdp_config.param_offload=true"))
    w2.init_model()
    res["retemplate"] = w2.retemplate
    res["retemplated"] = score(w2)
    res["retemplated_again"] = score(w2)  # after an offload/onload cycle
    from rlpost.utils import shm

    shm.SHM_ROOT = f"{tmp}/shm"  # this process's copies go under the test's folder
    w4 = RewardModelWorker(rm_config(rm_dir, None, "reward_model.model.use_shm=true",
                                     "reward_model.model.fsdp_config.forward_prefetch=true"))
    w4.init_model()
    res["shm_prefetch"] = score(w4)
    packed = ("reward_model.model.use_remove_padding=true",)
    for name, size in (("packed", 1), ("ulysses", 2)):
        w3 = RewardModelWorker(rm_config(rm_dir, None, *packed, f"reward_model.ulysses_sequence_parallel_size={size}"))
        w3.init_model()
        res[name] = score(w3)
        w3.config = w3.config.replace(use_dynamic_bsz=True, max_length=4)
        res[f"{name}_dynamic_truncated"] = score(w3)
    if rank == 0:
        res["tmp"] = tmp
        torch.save(res, f"{tmp}/res.pt")


@pytest.fixture(scope="module")
def results(dirs, tmp_path_factory):
    from transformers import AutoTokenizer

    rm_dir, policy_dir = dirs
    tmp = str(tmp_path_factory.mktemp("rm_run"))
    vocab = len(AutoTokenizer.from_pretrained(policy_dir))
    spawn(_run, (rm_dir, policy_dir, vocab, tmp), tmp)
    return torch.load(f"{tmp}/res.pt"), make_batch(vocab)


def _hf_scores(rm_dir: str, rows: list[list[int]]) -> torch.Tensor:
    """Reference: plain HF forward of each row alone (no padding)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(rm_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.stack([model(input_ids=torch.tensor([r])).logits[0, 0] for r in rows])


def _real_rows(batch: dict, keep: int | None = None) -> list[list[int]]:
    ids, mask = batch[keys.INPUT_IDS], batch[keys.ATTENTION_MASK].bool()
    rows = [ids[i][mask[i]].tolist() for i in range(ids.shape[0])]
    return [r[-keep:] for r in rows] if keep else rows


def _placed(scores: torch.Tensor, batch: dict) -> torch.Tensor:
    out = torch.zeros(batch[keys.RESPONSES].shape)
    for i, n in enumerate(batch[keys.RESPONSE_MASK].sum(-1).tolist()):
        out[i, n - 1] = scores[i]
    return out


@pytest.mark.timeout(280)
def test_scores_equal_plain_hf_forward_on_last_response_token(results, dirs):
    res, batch = results
    ref = _hf_scores(dirs[0], _real_rows(batch))
    assert ref.std() > 0.1  # rows score differently, so a wrong pooling position would show
    out = res["direct"]
    assert out.shape == (8, R) and out.dtype == torch.float32
    assert torch.allclose(out, _placed(ref, batch), atol=ATOL)
    assert (out != 0).sum() == 8  # one non-zero per row, on its last response token
    assert torch.allclose(res["dynamic"], out, atol=ATOL)


@pytest.mark.timeout(280)
def test_shared_memory_copy_and_forward_prefetch_score_the_same(results, dirs):
    """`model.use_shm` reads the RM from its /dev/shm copy (here under the test's folder) and
    `fsdp_config.forward_prefetch` prefetches the next unit's all-gather: the scores do not change."""
    res, _ = results
    torch.testing.assert_close(res["shm_prefetch"], res["direct"], atol=0, rtol=0)
    copies = list(Path(res["tmp"], "shm").rglob("config.json"))
    assert len(copies) == 1 and Path(dirs[0]).name in str(copies[0])


@pytest.mark.timeout(280)
def test_max_length_keeps_the_last_tokens(results, dirs):
    res, batch = results
    ref = _hf_scores(dirs[0], _real_rows(batch, keep=4))
    assert torch.allclose(res["truncated"], _placed(ref, batch), atol=ATOL)
    assert not torch.allclose(res["truncated"], res["direct"], atol=ATOL)


@pytest.mark.timeout(280)
def test_different_tokenizer_retemplates_and_scores(results, dirs):
    from transformers import AutoTokenizer

    res, batch = results
    rm_dir, policy_dir = dirs
    src, rm_tok = AutoTokenizer.from_pretrained(policy_dir), AutoTokenizer.from_pretrained(rm_dir)
    assert res["retemplate"] is True
    ids, mask = batch[keys.INPUT_IDS], batch[keys.ATTENTION_MASK].bool()
    rows = []
    for i in range(8):
        prompt = src.decode(ids[i, :-R][mask[i, :-R]].tolist(), skip_special_tokens=True)
        response = src.decode(ids[i, -R:][mask[i, -R:]].tolist(), skip_special_tokens=True)
        text = f"### user:\n{prompt}\n### assistant:\n{response}\n### end"
        rows.append(rm_tok(text, add_special_tokens=False)["input_ids"])
    expected = _placed(_hf_scores(rm_dir, rows), batch)
    assert torch.allclose(res["retemplated"], expected, atol=ATOL)
    assert torch.equal(res["retemplated_again"], res["retemplated"])
    assert not torch.allclose(res["retemplated"], res["direct"], atol=ATOL)


def _chat_batch(src) -> DataProto:
    """One row: ChatML prompt 'What is 2 + 3?' (left-padded) and response '#### 5<|im_end|>' (right-padded)."""
    prompt = src.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=True,
                                     add_generation_prompt=True, return_dict=False)
    resp = src("#### 5", add_special_tokens=False)["input_ids"] + [src.eos_token_id]
    p_ids = torch.tensor([[0, 0] + list(prompt)])
    r_ids = torch.tensor([resp + [0, 0]])
    mask = torch.cat([(p_ids != 0), torch.tensor([[1] * len(resp) + [0, 0]]).bool()], dim=1).long()
    tensors = {keys.INPUT_IDS: torch.cat([p_ids, r_ids], 1), keys.ATTENTION_MASK: mask,
               keys.POSITION_IDS: (mask.cumsum(-1) - 1).clamp(min=0), keys.RESPONSES: r_ids}
    return DataProto.from_dict(tensors=tensors)


def test_rm_chat_texts_use_the_rm_template(dirs):
    from transformers import AutoTokenizer

    from rlpost.workers.reward_model import rm_chat_texts, same_tokenizer, tokenize_left_padded

    src, rm_tok = AutoTokenizer.from_pretrained(dirs[1]), AutoTokenizer.from_pretrained(dirs[0])
    assert same_tokenizer(src, AutoTokenizer.from_pretrained(dirs[1])) and not same_tokenizer(src, rm_tok)
    data = _chat_batch(src)
    (text,) = rm_chat_texts(data, src, rm_tok)
    assert text.startswith("### user:\n") and "What is 2 + 3?" in text
    assert text.endswith("### assistant:\n#### 5\n### end") and "<|im_start|>" not in text
    data.non_tensor_batch[keys.RAW_PROMPT] = np.array(
        [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]], dtype=object)
    (text,) = rm_chat_texts(data, src, rm_tok)
    assert text == "### system:\nBe brief.\n### user:\nWhat is 2 + 3?\n### assistant:\n#### 5\n### end"
    full = tokenize_left_padded([text, "### end"], rm_tok, None)
    assert rm_tok.decode(full[keys.INPUT_IDS][0]) == text
    assert full[keys.ATTENTION_MASK][1].sum() < full[keys.ATTENTION_MASK][0].sum()
    assert full[keys.ATTENTION_MASK][1, -1] == 1 and full[keys.ATTENTION_MASK][1, 0] == 0  # left padding
    cut = tokenize_left_padded([text], rm_tok, 5)
    assert cut[keys.INPUT_IDS].tolist() == [full[keys.INPUT_IDS][0, -5:].tolist()]  # the end is kept


def test_right_align_keep_last_and_placement():
    from rlpost.workers.reward_model import keep_last, place_on_last_token, right_align

    ids = torch.tensor([[0, 7, 8, 9, 0], [4, 5, 0, 0, 0]])
    mask = (ids != 0).long()
    pos = torch.tensor([[0, 0, 1, 2, 2], [0, 1, 1, 1, 1]])
    out = right_align({keys.INPUT_IDS: ids, keys.ATTENTION_MASK: mask, keys.POSITION_IDS: pos})
    assert out[keys.INPUT_IDS].tolist() == [[0, 0, 7, 8, 9], [0, 0, 0, 4, 5]]
    assert out[keys.POSITION_IDS].tolist() == [[0, 2, 0, 1, 2], [1, 1, 1, 0, 1]]
    assert keep_last(out, 2)[keys.INPUT_IDS].tolist() == [[8, 9], [4, 5]]
    placed = place_on_last_token(torch.tensor([1.5, -2.0, 3.0]), torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]]))
    assert placed.tolist() == [[0.0, 1.5, 0.0], [0.0, 0.0, -2.0], [0.0, 0.0, 0.0]]


@pytest.mark.timeout(280)
def test_packed_and_ulysses_scores_equal_the_padded_ones(results):
    """Packed rows (remove-padding) and Ulysses SP 2 (the 2 ranks share the 8 rows, each runs half of every
    packed row; the RM's one KV head is repeated for the 2 ranks) give the padded forward's scores within ATOL,
    also with token-count micro-batches and rows truncated to their last 4 tokens."""
    res, _ = results
    for name in ("packed", "ulysses"):
        torch.testing.assert_close(res[name], res["direct"], atol=ATOL, rtol=0, msg=name)
        torch.testing.assert_close(res[f"{name}_dynamic_truncated"], res["truncated"], atol=ATOL, rtol=0, msg=name)


@pytest.mark.timeout(60)
def test_ulysses_needs_remove_padding_and_the_plan_lists_it(dirs):
    """SP > 1 on padded rows is refused at start-up, naming the fix; valid sizes show in the dry-run plan."""
    from rlpost.trainer.config import ConfigError, typed_config
    from rlpost.trainer.config.plan import dry_run_plan

    with pytest.raises(ConfigError, match="use reward_model.model.use_remove_padding=true"):
        rm_config(dirs[0], None, "reward_model.ulysses_sequence_parallel_size=2")
    cfg = full_config(dirs[0], dirs[0], "reward_model.model.use_remove_padding=true",
                      "reward_model.ulysses_sequence_parallel_size=2")
    assert "reward_model 2 (1 data-parallel groups)" in dry_run_plan(typed_config(cfg))


def test_a_causal_lm_is_refused_as_reward_model(tiny_model_dir):
    from rlpost.workers.reward_model import load_reward_model

    with pytest.raises(ValueError, match="not a sequence-classification checkpoint: missing .*score"):
        load_reward_model(rm_config(tiny_model_dir).model, torch.float32)


def test_trainer_uses_rm_scores_instead_of_the_rule(tmp_path, dirs):
    """`RayPPOTrainer._start_reward` / `_store_reward` with an RM group: token_level_scores are the RM's
    rm_scores, also when the reward function runs in the background (launch_reward_fn_async)."""
    from transformers import AutoTokenizer

    from rlpost.reward import load_reward_manager
    from rlpost.trainer.ppo.ray_trainer import RayPPOTrainer

    rule = tmp_path / "rule.py"
    rule.write_text(textwrap.dedent("""
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            raise AssertionError("rule must not run when rm_scores exist")
    """))
    cfg = full_config(dirs[0], dirs[1], f"custom_reward_function.path={rule}")
    tok = AutoTokenizer.from_pretrained(dirs[1])
    data = _chat_batch(tok)
    rm = torch.tensor([[0.0, 0.0, 2.5, 0.0, 0.0]])
    rm_group = SimpleNamespace(compute_rm_score=lambda b: DataProto.from_dict(tensors={keys.RM_SCORES: rm}))
    fake = SimpleNamespace(workers=SimpleNamespace(reward_model=rm_group),
                           reward_fn=load_reward_manager(cfg, tok))
    job = RayPPOTrainer._start_reward(fake, data, run_async=True)
    extra = RayPPOTrainer._store_reward(fake, data, job)
    assert extra == []
    assert torch.equal(data.batch[keys.TOKEN_LEVEL_SCORES], rm) and keys.RM_SCORES in data.batch


def test_override_config_reaches_the_reward_models_hf_config(dirs):
    """reward_model.model.override_config is applied before the weights load, and the forward runs with it."""
    from rlpost.workers.reward_model import load_reward_model

    plain = load_reward_model(rm_config(dirs[0]).model, torch.float32)
    eps = load_reward_model(rm_config(dirs[0], None, "+reward_model.model.override_config.rms_norm_eps=0.5").model,
                            torch.float32)
    assert eps.config.rms_norm_eps == 0.5 and plain.config.rms_norm_eps != 0.5
    ids = torch.tensor([[3, 5, 7, 9]])
    with torch.no_grad():
        assert not torch.allclose(plain(input_ids=ids).logits, eps(input_ids=ids).logits)
