"""ResumableLoader / samplers: batch order, epochs, exact resume from a saved state, and user samplers
(`data.sampler`): a curriculum by prompt length, loaded from a file or a module, resumed by skipping
(stateless) or through its own state_dict (stateful)."""

import textwrap

import pandas as pd
import pytest
import torch
from torch.utils.data import Dataset

from _compose import SMALL, compose_config
from rlpost import keys
from rlpost.data import (EpochSeededSampler, ResumableLoader, RLHFDataset, create_rl_sampler, create_train_loader,
                         create_val_loader)


class Range(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.tensor(i)}


def ids(batch):
    return batch["x"].tolist()


def data_cfg(*overrides: str):
    """The `data` group of the default config with `data.*` overrides."""
    return compose_config(*SMALL, "actor_rollout_ref.rollout.name=hf", *overrides).data


def test_sampler_choice_and_determinism():
    ds = Range(10)
    shuffled = create_rl_sampler(data_cfg("data.seed=3"), ds)  # train_shuffle defaults to true
    assert isinstance(shuffled, EpochSeededSampler) and shuffled.seed == 3
    assert list(create_rl_sampler(data_cfg("data.train_shuffle=false"), ds)) == list(range(10))
    s = EpochSeededSampler(10, seed=3)
    first = list(s)
    assert sorted(first) == list(range(10)) and first == list(EpochSeededSampler(10, seed=3))
    s.set_epoch(1)
    assert list(s) != first


def test_len_and_drop_last():
    ds = Range(10)
    assert len(ResumableLoader(ds, 3, drop_last=True)) == 3
    assert len(ResumableLoader(ds, 3, drop_last=False)) == 4
    assert [ids(b) for b in ResumableLoader(ds, 4, drop_last=False)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_resume_mid_epoch_and_across_epochs():
    ds = Range(12)
    full = ResumableLoader(ds, 3, EpochSeededSampler(12, seed=7))
    reference = [ids(b) for _ in range(2) for b in full]  # two epochs = 8 batches
    assert reference[:4] != reference[4:]  # reshuffled per epoch

    first = ResumableLoader(ds, 3, EpochSeededSampler(12, seed=7))
    seen = []
    for batch in first:
        seen.append(ids(batch))
        if len(seen) == 2:
            break
    state = first.state_dict()
    assert state == {"epoch": 0, "batches_done": 2, "seed": 7}

    resumed = ResumableLoader(ds, 3, EpochSeededSampler(12, seed=7))
    resumed.load_state_dict(state)
    seen += [ids(b) for b in resumed]  # rest of epoch 0
    seen += [ids(b) for b in resumed]  # epoch 1
    assert seen == reference
    assert resumed.state_dict() == {"epoch": 1, "batches_done": 4, "seed": 7}


def test_seed_mismatch_rejected():
    loader = ResumableLoader(Range(4), 2, EpochSeededSampler(4, seed=1))
    with pytest.raises(ValueError, match="seed 5"):
        loader.load_state_dict({"epoch": 0, "batches_done": 1, "seed": 5})


def test_train_and_val_loaders():
    cfg = data_cfg("data.train_batch_size=4")
    train = create_train_loader(cfg, Range(10))
    assert len(train) == 2 and all(len(ids(b)) == 4 for b in train)
    assert isinstance(train.sampler, EpochSeededSampler) and train.sampler.seed == 1  # data.seed default
    val = create_val_loader(cfg, Range(10))
    assert [ids(b) for b in val] == [list(range(10))]  # val_batch_size null: one batch


SAMPLERS = '''
from torch.utils.data import Sampler


class ShortestFirst(Sampler):
    """Curriculum: prompts by token count, shortest first (ties by index)."""

    def __init__(self, data_source, data_config):
        self.order = sorted(range(len(data_source)),
                            key=lambda i: (int(data_source[i]["attention_mask"].sum()), i))

    def __iter__(self):
        return iter(self.order)

    def __len__(self):
        return len(self.order)


class StatefulShortestFirst(ShortestFirst):
    """The same order; remembers how far the current pass went, so a restored one continues from there."""

    def __init__(self, data_source, data_config):
        super().__init__(data_source, data_config)
        self.given = 0

    def __iter__(self):
        for i in self.order[self.given:]:
            self.given += 1
            yield i
        self.given = 0

    def state_dict(self):
        return {"given": self.given}

    def load_state_dict(self, state):
        self.given = state["given"]
'''

# Steps of 2 prompts (the mini- and micro-batches shrink with them so the config stays valid).
TWO_PROMPTS = ("data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1")
QUESTIONS = ["What is 12 + 7 and then times 3?", "hi", "What is 2 + 2?", "ok", "Compute 100 - 1.", "A longer one: 5 * 5?"]


@pytest.fixture(scope="module")
def prompts(tiny_model_dir, tmp_path_factory):
    """(parquet path, tokenizer, sampler file): prompts of different lengths."""
    from transformers import AutoTokenizer

    tmp = tmp_path_factory.mktemp("sampler")
    path = tmp / "prompts.parquet"
    pd.DataFrame([{"data_source": "rlpost/arith", "prompt": [{"role": "user", "content": q}],
                   "reward_model": {"style": "rule", "ground_truth": "0"}, "extra_info": {"index": i}}
                  for i, q in enumerate(QUESTIONS)]).to_parquet(path)
    (tmp / "curriculum.py").write_text(textwrap.dedent(SAMPLERS))
    return str(path), AutoTokenizer.from_pretrained(tiny_model_dir), str(tmp / "curriculum.py")


def _sampled(prompts, class_path: str, class_name: str, *overrides: str):
    path, tok, _ = prompts
    cfg = data_cfg(f"data.sampler.class_path={class_path}", f"data.sampler.class_name={class_name}",
                   "data.max_prompt_length=32", *TWO_PROMPTS, *overrides)
    dataset = RLHFDataset(path, tok, cfg)
    return dataset, create_train_loader(cfg, dataset)


def _index(batch):
    return [int(i) for i in batch[keys.INDEX]]


def test_curriculum_sampler_orders_batches_by_prompt_length(prompts):
    dataset, loader = _sampled(prompts, prompts[2], "ShortestFirst")
    assert type(loader.sampler).__name__ == "ShortestFirst"
    lengths = [int(dataset[i][keys.ATTENTION_MASK].sum()) for i in range(len(dataset))]
    expected = sorted(range(len(QUESTIONS)), key=lambda i: (lengths[i], i))
    order = [i for batch in loader for i in _index(batch)]
    assert order == expected and order != list(range(len(QUESTIONS)))
    assert [lengths[i] for i in order] == sorted(lengths)


@pytest.mark.parametrize("name", ["ShortestFirst", "StatefulShortestFirst"])
def test_custom_sampler_resumes_where_it_stopped(prompts, name):
    _, reference = _sampled(prompts, prompts[2], name)
    expected = [_index(b) for _ in range(2) for b in reference]  # two epochs of 3 batches

    _, first = _sampled(prompts, prompts[2], name)
    seen = [_index(next(iter(first)))]
    state = first.state_dict()
    assert ("sampler" in state) == (name == "StatefulShortestFirst")  # its own position: 2 indices given
    assert state.get("sampler", {"given": 2}) == {"given": 2} and state["batches_done"] == 1

    _, resumed = _sampled(prompts, prompts[2], name)
    resumed.load_state_dict(state)
    seen += [_index(b) for b in resumed]  # rest of epoch 0: skipped by the loader, or by the sampler itself
    seen += [_index(b) for b in resumed]  # epoch 1 from the start
    assert seen == expected


def test_sampler_from_a_module_and_errors(prompts, tmp_path, monkeypatch):
    (tmp_path / "my_curriculum_mod.py").write_text(textwrap.dedent(SAMPLERS))
    monkeypatch.syspath_prepend(str(tmp_path))
    _, loader = _sampled(prompts, "pkg://my_curriculum_mod", "ShortestFirst")
    _, from_file = _sampled(prompts, prompts[2], "ShortestFirst")
    assert [_index(b) for b in loader] == [_index(b) for b in from_file]
    with pytest.raises(ValueError, match="data.sampler.class_name: 'Missing' not found"):
        _sampled(prompts, prompts[2], "Missing")
    with pytest.raises(FileNotFoundError, match="data.sampler.class_path: file not found: /no/sampler.py"):
        _sampled(prompts, "/no/sampler.py", "X")
    with pytest.raises(ValueError, match="data.dataloader_num_workers=2: .*use data.dataloader_num_workers=0"):
        _sampled(prompts, prompts[2], "ShortestFirst", "data.dataloader_num_workers=2")
