"""ResumableLoader / samplers: batch order, epochs, and exact resume from a saved state."""

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import Dataset

from rlpost.data import EpochSeededSampler, ResumableLoader, create_rl_sampler, create_train_loader, create_val_loader


class Range(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.tensor(i)}


def ids(batch):
    return batch["x"].tolist()


def test_sampler_choice_and_determinism():
    ds = Range(10)
    assert isinstance(create_rl_sampler(OmegaConf.create({"shuffle": True, "seed": 3}), ds), EpochSeededSampler)
    assert list(create_rl_sampler(OmegaConf.create({"shuffle": False}), ds)) == list(range(10))
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
    cfg = OmegaConf.create({"train_batch_size": 4, "shuffle": True, "seed": 1, "val_batch_size": None,
                            "validation_shuffle": False})
    train = create_train_loader(cfg, Range(10))
    assert len(train) == 2 and all(len(ids(b)) == 4 for b in train)
    val = create_val_loader(cfg, Range(10))
    assert [ids(b) for b in val] == [list(range(10))]
