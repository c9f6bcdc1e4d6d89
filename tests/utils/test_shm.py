"""Shared-memory copies (model.use_shm, data.use_shm): where the copy goes, reuse, refresh, and loading the
actor's model and the parquet rows through it."""

import os

import pytest
import torch

from rlpost.utils import shm

pytestmark = pytest.mark.timeout(60)


def test_copy_is_placed_reused_and_refreshed(tmp_path):
    src = tmp_path / "model"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "w.bin").write_bytes(b"\x00" * 10)
    root = tmp_path / "shm"
    dest = shm.copy_to_shm(src, root=str(root))
    assert dest == str(shm.shm_path(src, root=str(root))) and dest.endswith("/model")
    assert os.path.dirname(dest).startswith(str(root)) and len(os.path.basename(os.path.dirname(dest))) == 32
    assert (root / dest / "sub" / "w.bin").read_bytes() == b"\x00" * 10
    stamp = os.stat(os.path.join(dest, "config.json")).st_mtime_ns
    assert shm.copy_to_shm(src, root=str(root)) == dest  # identical copy: reused, not rewritten
    assert os.stat(os.path.join(dest, "config.json")).st_mtime_ns == stamp
    (src / "sub" / "w.bin").write_bytes(b"\x01" * 12)  # the source changed: the copy is refreshed
    assert open(os.path.join(shm.copy_to_shm(src, root=str(root)), "sub", "w.bin"), "rb").read() == b"\x01" * 12
    assert [p.name for p in root.iterdir()] == [os.path.basename(os.path.dirname(dest))]  # no staging left
    one_file = tmp_path / "rows.parquet"
    one_file.write_bytes(b"abc")
    assert open(shm.copy_to_shm(one_file, root=str(root)), "rb").read() == b"abc"
    with pytest.raises(FileNotFoundError, match="use_shm: /no/such/model does not exist"):
        shm.copy_to_shm("/no/such/model", root=str(root))


def test_model_and_data_load_through_the_copy(tiny_model_dir, tmp_path, monkeypatch):
    import pandas as pd

    from _compose import SMALL, compose_config
    from rlpost.data.rl_dataset import read_parquet_files
    from rlpost.utils.model import load_model

    monkeypatch.setattr(shm, "SHM_ROOT", str(tmp_path / "shm"))
    cfg = compose_config(*SMALL, f"actor_rollout_ref.model.path={tiny_model_dir}", f"critic.model.path={tiny_model_dir}",
                         "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.model.use_shm=true")
    model_cfg = cfg.actor_rollout_ref.model
    copy = shm.local_model_path(model_cfg)
    assert copy.startswith(str(tmp_path / "shm")) and sorted(os.listdir(copy)) == sorted(os.listdir(tiny_model_dir))
    model = load_model(model_cfg, torch.float32)
    plain = compose_config(*SMALL, f"actor_rollout_ref.model.path={tiny_model_dir}", "actor_rollout_ref.rollout.name=hf")
    ref = load_model(plain.actor_rollout_ref.model, torch.float32)  # use_shm false: the original folder
    for (name, a), (_, b) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), name
    rows = tmp_path / "rows.parquet"
    pd.DataFrame({"x": [1, 2]}).to_parquet(rows)
    assert read_parquet_files(str(rows), use_shm=True)["x"].tolist() == [1, 2]
    assert any(p.name == "rows.parquet" for p in (tmp_path / "shm").rglob("*"))
