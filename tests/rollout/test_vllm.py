"""vLLM CPU engine, in-process: weight sync vs HF, sampling options, log-probs, sleep/wake memory.

ONE engine for the whole module (start-up costs seconds on 2 cores); tests mutate copies of the HF
"actor" model and sync them in, so each test begins by syncing the weights it needs.
"""

import contextlib
import os

import numpy as np
import psutil
import pytest
import torch

from _compose import SMALL, compose_config
from rlpost import keys
from rlpost.protocol import DataProto
from rlpost.rollout.drift import rollout_probs_diff

R = 8
# The module's engine: fp32, prompts up to 32 tokens, R response tokens, engine log-probs.
ENGINE = ("actor_rollout_ref.rollout.dtype=float32", "data.max_prompt_length=32", f"data.max_response_length={R}",
          "actor_rollout_ref.rollout.calculate_log_probs=true", "actor_rollout_ref.rollout.max_num_batched_tokens=1024",
          "actor_rollout_ref.rollout.max_num_seqs=32")


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlpost.rollout import build_rollout

    tok = AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")
    cfg = _rollout_cfg(*ENGINE)
    assert cfg.load_format == "dummy_dtensor" and cfg.free_cache_engine and cfg.val_kwargs.temperature == 0
    rollout = build_rollout(cfg, tiny_model_dir, tok, "cpu")
    actor = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    _perturb(actor, seed=1)  # sharpen the random model so greedy outputs vary with the prompt
    rollout.update_weights(actor.named_parameters())
    return rollout, actor, tok, cfg


def _rollout_cfg(*overrides: str, device: str = "cpu"):
    """`actor_rollout_ref.rollout` of the default config, engine vllm, on `device`."""
    return compose_config(*SMALL, "actor_rollout_ref.rollout.name=vllm", f"trainer.device={device}",
                          *overrides).actor_rollout_ref.rollout


def _perturb(model, seed: int, scale: float = 0.5) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def _batch(tok, texts, **meta) -> DataProto:
    enc = tok(texts, return_tensors="pt", padding=True)
    pos = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={keys.INPUT_IDS: enc.input_ids, keys.ATTENTION_MASK: enc.attention_mask, keys.POSITION_IDS: pos},
        non_tensors={keys.UID: np.array([f"u{i}" for i in range(len(texts))], dtype=object)},
        meta_info={keys.META_EOS_TOKEN_ID: tok.eos_token_id, keys.META_PAD_TOKEN_ID: tok.pad_token_id, **meta},
    )


def _hf_greedy(actor, data: DataProto) -> list[list[int]]:
    ids, mask = data.batch[keys.INPUT_IDS], data.batch[keys.ATTENTION_MASK]
    out = actor.generate(input_ids=ids, attention_mask=mask, max_new_tokens=R, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    return out[:, ids.shape[1]:].tolist()


PROMPTS = ["What is 12 + 7?", "hi", "assistant\n3 * 4 = 12. #### 12", "system\nYou are"]


@contextlib.contextmanager
def ignoring_eos(rollout):
    """The engine with `ignore_eos=true` for the block: its typed config is never rewritten, so a changed copy
    is swapped in and the original put back."""
    typed = rollout.config
    rollout.config = typed.replace(ignore_eos=True)
    try:
        yield
    finally:
        rollout.config = typed


def test_greedy_after_sync_equals_hf_generate_left_padded(setup):
    rollout, actor, tok, cfg = setup
    data = _batch(tok, PROMPTS, do_sample=False)
    assert len(set(data.batch[keys.ATTENTION_MASK].sum(-1).tolist())) > 1  # prompts of different lengths
    with ignoring_eos(rollout):  # compare all R tokens; EOS handling is tested below
        out = rollout.generate_sequences(data)
    assert out.batch[keys.RESPONSES].tolist() == _hf_greedy(actor, data)
    P = data.batch[keys.INPUT_IDS].shape[1]
    assert out.batch[keys.INPUT_IDS].shape == (4, P + R) and out.batch[keys.RESPONSE_MASK].shape == (4, R)
    last = data.batch[keys.POSITION_IDS][:, -1:]
    assert torch.equal(out.batch[keys.POSITION_IDS][:, P:], last + torch.arange(1, R + 1))
    assert list(out.non_tensor_batch[keys.UID]) == ["u0", "u1", "u2", "u3"]
    assert rollout.last_sync_s > 0


def test_per_sample_response_caps_cut_each_row_of_a_group(setup):
    """Rows of one uid take their prompt's caps in turn; each capped row is the uncapped greedy row's prefix."""
    rollout, actor, tok, cfg = setup
    base = _batch(tok, PROMPTS[:2], do_sample=False)
    data = base.repeat(2, interleave=True)  # u0 u0 u1 u1, as the trainer repeats a group
    with ignoring_eos(rollout):
        full = rollout.generate_sequences(data).batch[keys.RESPONSES]
        data.non_tensor_batch[keys.RESPONSE_CAPS] = np.array([[3, 5], [3, 5], [R + 4, 1], [R + 4, 1]],
                                                             dtype=object)
        out = rollout.generate_sequences(data)
    lengths = out.batch[keys.RESPONSE_MASK].sum(-1).tolist()
    assert lengths == [3, 5, R, 1]  # a cap above the response length stops at R
    pad = tok.pad_token_id
    for row, n in enumerate(lengths):
        assert out.batch[keys.RESPONSES][row, :n].tolist() == full[row, :n].tolist()
        assert set(out.batch[keys.RESPONSES][row, n:].tolist()) <= {pad}


def test_generation_changes_only_after_sync(setup):
    rollout, actor, tok, _ = setup
    data = _batch(tok, PROMPTS, do_sample=False)
    before = rollout.generate_sequences(data).batch[keys.RESPONSES]
    saved = {k: v.clone() for k, v in actor.state_dict().items()}
    _perturb(actor, seed=2)
    try:
        assert torch.equal(rollout.generate_sequences(data).batch[keys.RESPONSES], before)  # not synced yet
        rollout.update_weights(actor.named_parameters())
        assert not torch.equal(rollout.generate_sequences(data).batch[keys.RESPONSES], before)
    finally:
        actor.load_state_dict(saved)
        rollout.update_weights(actor.named_parameters())


def test_rollout_log_probs_match_hf_at_temperature_one(setup):
    rollout, actor, tok, _ = setup
    data = _batch(tok, PROMPTS * 2)
    out = rollout.generate_sequences(data)
    ids, mask = out.batch[keys.INPUT_IDS], out.batch[keys.ATTENTION_MASK]
    with torch.no_grad():
        logits = actor(input_ids=ids, attention_mask=mask, position_ids=out.batch[keys.POSITION_IDS]).logits
    P = data.batch[keys.INPUT_IDS].shape[1]
    lp = torch.log_softmax(logits[:, P - 1 : -1].float(), -1)
    actor_lp = lp.gather(-1, out.batch[keys.RESPONSES].unsqueeze(-1)).squeeze(-1)
    resp_mask = out.batch[keys.RESPONSE_MASK]
    drift = rollout_probs_diff(out.batch[keys.ROLLOUT_LOG_PROBS], actor_lp, resp_mask)
    assert resp_mask.sum() > 0
    assert drift["training/rollout_probs_diff_mean"] < 1e-3  # fp32 engine vs fp32 HF
    assert drift["training/rollout_probs_diff_max"] < 1e-2


def test_n_rows_of_one_prompt_sample_differently_and_val_kwargs_greedy(setup):
    rollout, _, tok, _ = setup
    data = _batch(tok, ["hi"] * 6)
    sampled = rollout.generate_sequences(data).batch[keys.RESPONSES]
    assert len({tuple(r) for r in sampled.tolist()}) > 1
    val = rollout.generate_sequences(_batch(tok, ["hi"] * 6, validate=True)).batch[keys.RESPONSES]
    assert len({tuple(r) for r in val.tolist()}) == 1  # val_kwargs: temperature 0, do_sample False
    greedy = rollout.generate_sequences(_batch(tok, ["hi"], do_sample=False)).batch[keys.RESPONSES]
    assert val[0].tolist() == greedy[0].tolist()


def test_eos_stops_response_and_masks_the_rest(setup):
    rollout, _, tok, cfg = setup
    full = rollout.generate_sequences(_batch(tok, PROMPTS, do_sample=False)).batch[keys.RESPONSES]
    eos = int(full[0, 2])  # pretend the 3rd greedy token of row 0 is EOS
    out = rollout.generate_sequences(_batch(tok, PROMPTS, do_sample=False, eos_token_id=eos))
    row, mask = out.batch[keys.RESPONSES][0], out.batch[keys.RESPONSE_MASK][0]
    first = full[0].tolist().index(eos)
    assert row[: first + 1].tolist() == full[0, : first + 1].tolist()
    assert (row[first + 1 :] == tok.pad_token_id).all()
    assert mask.tolist() == [1] * (first + 1) + [0] * (R - first - 1)
    with ignoring_eos(rollout):
        cont = rollout.generate_sequences(_batch(tok, PROMPTS, do_sample=False, eos_token_id=eos))
    assert cont.batch[keys.RESPONSES][0].tolist() == full[0].tolist()  # kept generating past EOS
    assert cont.batch[keys.RESPONSE_MASK][0].tolist() == mask.tolist()  # but trains only up to it


@pytest.mark.timeout(200)
def test_sleep_wake_sync_cycles_keep_rss_bounded(setup):
    rollout, actor, tok, _ = setup
    proc = psutil.Process(os.getpid())
    data = _batch(tok, PROMPTS * 4)
    rss = []
    for _ in range(3):
        rollout.generate_sequences(data)
        rollout.sleep()
        rollout.wake_up()
        rollout.update_weights(actor.named_parameters())
        rss.append(proc.memory_info().rss)
    assert rss[-1] - rss[0] < 64 * 2**20, [r / 2**20 for r in rss]


def test_hf_rollout_greedy_equals_vllm_greedy(setup):
    from rlpost.rollout import build_rollout

    rollout, actor, tok, cfg = setup
    hf_cfg = _rollout_cfg(*ENGINE, "actor_rollout_ref.rollout.name=hf")
    hf_rollout = build_rollout(hf_cfg, "unused", tok, "cpu", module=actor)
    data = _batch(tok, PROMPTS, do_sample=False)
    ref = rollout.generate_sequences(data)
    out = hf_rollout.generate_sequences(data)
    for key in (keys.RESPONSES, keys.RESPONSE_MASK, keys.INPUT_IDS, keys.POSITION_IDS, keys.ATTENTION_MASK):
        assert torch.equal(out.batch[key], ref.batch[key]), key
    # greedy log-probs: processed scores = raw log-softmax on both sides
    assert torch.allclose(out.batch[keys.ROLLOUT_LOG_PROBS], ref.batch[keys.ROLLOUT_LOG_PROBS], atol=1e-3)
    hf_rollout.update_weights(iter(()))  # shares the actor module: a no-op
    assert hf_rollout.last_sync_s == 0.0


def test_engine_kwargs_mapping_and_errors(monkeypatch):
    from rlpost.rollout.utils import load_format_name
    from rlpost.rollout.vllm import engine_kwargs

    seed = "+actor_rollout_ref.rollout.engine_kwargs.vllm.seed=3"
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    kw = engine_kwargs(_rollout_cfg(seed), "/m", "cpu")
    assert kw["load_format"] == "dummy" and kw["max_model_len"] == 16 + 8 and kw["seed"] == 3 + 3
    # verl's rollout.seed is the base when set (replica index added); an engine_kwargs seed that disagrees is named
    assert engine_kwargs(_rollout_cfg("actor_rollout_ref.rollout.seed=42"), "/m", "cpu")["seed"] == 42 + 3
    with pytest.raises(ValueError, match="rollout.seed=42 and the engine_kwargs seed 3 disagree"):
        engine_kwargs(_rollout_cfg(seed, "actor_rollout_ref.rollout.seed=42"), "/m", "cpu")
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["enable_sleep_mode"] is False
    assert kw["enable_prefix_caching"] is True and "compilation_config" not in kw
    assert "distributed_executor_backend" not in kw
    tp2 = _rollout_cfg(seed, "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                       device="cuda")
    gpu = engine_kwargs(tp2, "/m", "cuda")
    assert gpu["distributed_executor_backend"] == "external_launcher" and "data_parallel_size" not in gpu
    assert gpu["tensor_parallel_size"] == 2 and gpu["disable_custom_all_reduce"] is True
    one = engine_kwargs(_rollout_cfg(seed, device="cuda"), "/m", "cuda")
    assert "distributed_executor_backend" not in one and one["enable_sleep_mode"] is True  # TP=1: no launcher
    assert gpu["seed"] == 3 + 1  # TP peers (ranks 2, 3) share a seed
    tuned = engine_kwargs(_rollout_cfg("actor_rollout_ref.rollout.max_model_len=100",
                                       "actor_rollout_ref.rollout.enable_prefix_caching=false",
                                       "actor_rollout_ref.rollout.cudagraph_capture_sizes=[1,2,4]"), "/m", "cpu")
    assert tuned["max_model_len"] == 100 and tuned["enable_prefix_caching"] is False
    assert tuned["compilation_config"] == {"cudagraph_capture_sizes": [1, 2, 4]}
    assert engine_kwargs(_rollout_cfg("actor_rollout_ref.rollout.load_format=hf"), "/m", "cpu")["load_format"] == "auto"
    cpu = engine_kwargs(tp2, "/m", "cpu")  # CPU: the same launcher, its collectives over gloo
    assert cpu["distributed_executor_backend"] == "external_launcher" and cpu["tensor_parallel_size"] == 2
    with pytest.raises(ValueError, match="load_format='bogus'"):
        load_format_name("bogus")
    with pytest.raises(NotImplementedError, match="not supported yet: .*swap_space"):
        engine_kwargs(_rollout_cfg("actor_rollout_ref.rollout.engine_kwargs.swap_space=4"), "/m", "cpu")


def test_model_runner_key_sets_the_engine_environment_on_gpu_and_is_refused_on_cpu(monkeypatch):
    from rlpost.rollout.vllm import apply_engine_env, engine_env
    from rlpost.trainer.config import ConfigError

    runner = "actor_rollout_ref.rollout.model_runner"
    assert engine_env(_rollout_cfg(device="cuda"), "cuda") == {} == engine_env(_rollout_cfg(), "cpu")  # null: unset
    assert engine_env(_rollout_cfg(f"{runner}=v2", device="cuda"), "cuda") == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert engine_env(_rollout_cfg(f"{runner}=v1", device="cuda"), "cuda") == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    with pytest.raises(ValueError, match="model_runner=v2: vLLM's CPU backend has its own model runner; set it to null"):
        engine_env(_rollout_cfg(f"{runner}=v2"), "cpu")
    with pytest.raises(ConfigError, match=r"model_runner=v3: must be null \(the engine's choice\), v1 or v2; use .*=null"):
        _rollout_cfg(f"{runner}=v3", device="cuda")
    # the variable reaches vLLM's own reading of it; once an engine of this process has cached vLLM's environment, a
    # runner other than the cached one is refused by name instead of silently ignored
    from vllm import envs

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "0"))  # restored after
    if envs._is_envs_cache_enabled():
        other = "0" if envs.VLLM_USE_V2_MODEL_RUNNER else "1"
        with pytest.raises(RuntimeError, match="an engine started earlier in this process fixed vLLM's"):
            apply_engine_env({"VLLM_USE_V2_MODEL_RUNNER": other})
    else:
        apply_engine_env({"VLLM_USE_V2_MODEL_RUNNER": "1"})
        assert envs.VLLM_USE_V2_MODEL_RUNNER is True


def test_engine_kwargs_reserve_one_lora_slot_of_a_valid_rank():
    from rlpost.rollout.vllm import engine_kwargs

    assert "enable_lora" not in engine_kwargs(_rollout_cfg(), "/m", "cpu")
    kw = engine_kwargs(_rollout_cfg(), "/m", "cpu", lora_rank=12)
    assert (kw["enable_lora"], kw["max_loras"], kw["max_lora_rank"]) == (True, 1, 16)  # vLLM's next allowed rank
    assert engine_kwargs(_rollout_cfg(), "/m", "cpu", lora_rank=64)["max_lora_rank"] == 64
    with pytest.raises(ValueError, match="lora_rank=1024: vLLM serves adapters up to rank 512; .*lora.merge=true"):
        engine_kwargs(_rollout_cfg(), "/m", "cpu", lora_rank=1024)


def test_over_sample_rate_aborts_the_slowest_groups_in_the_engine(setup):
    """rollout.over_sample_rate=0.75 on 4 groups of 2 greedy rows: ceil(0.25 x 4) = 1 group, the one whose responses
    end first, is kept with the tokens of a plain generation; the other 3 come back empty and flagged (their
    requests aborted mid-generation), and nothing is left running in the engine.
    The finishing order is derived from the plain generation: row 0's 2nd greedy token is used as EOS, so each
    prompt's response ends at its first occurrence of that token (or runs to R)."""
    from rlpost.rollout.async_mode import generate_concurrently

    rollout, _, tok, _ = setup
    full = rollout.generate_sequences(_batch(tok, PROMPTS, do_sample=False)).batch[keys.RESPONSES].tolist()
    eos = full[0][1]
    ends = [row.index(eos) + 1 if eos in row else R for row in full]
    order = sorted(range(4), key=lambda g: ends[g])
    assert ends[order[0]] < ends[order[1]], ends  # one group ends first: the cut is unambiguous
    data = _batch(tok, PROMPTS, do_sample=False, eos_token_id=eos).repeat(2, interleave=True)
    typed = rollout.config
    rollout.config = typed.replace(over_sample_rate=0.75)
    try:
        out = generate_concurrently(rollout, data)
    finally:
        rollout.config = typed
    kept = {order[0]}
    assert out.non_tensor_batch[keys.OVER_SAMPLE_CUT].tolist() == [g not in kept for g in range(4) for _ in range(2)]
    assert out.non_tensor_batch[keys.OVER_SAMPLE_ABORTED].tolist() == [g not in kept for g in range(4) for _ in range(2)]
    lengths = out.batch[keys.RESPONSE_MASK].sum(-1).tolist()
    for row in range(8):
        g = row // 2
        if g in kept:
            assert lengths[row] == ends[g] and out.batch[keys.RESPONSES][row, :ends[g]].tolist() == full[g][:ends[g]]
        else:
            assert lengths[row] == 0
    assert not rollout.llm.llm_engine.has_unfinished_requests()
