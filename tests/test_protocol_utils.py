"""verl's protocol helpers and DataProto methods, each against hand-written expected rows."""

import pickle

import numpy as np
import pytest
import torch

from rlpost.protocol import (DataProto, DataProtoConfig, TensorBatch, deserialize_single_tensor,
                             deserialize_tensordict, fold_batch_dim, list_of_dict_to_dict_of_list,
                             serialize_single_tensor, serialize_tensordict, unfold_batch_dim, union_numpy_dict,
                             union_tensor_dict)


def rows(n=4):
    return DataProto.from_dict({"x": torch.arange(n * 2).reshape(n, 2)},
                               {"uid": np.array([f"u{i}" for i in range(n)], dtype=object)}, {"t": 1.0})


def test_union_tensor_dict_adds_keys_and_checks_shared_ones():
    a = TensorBatch({"x": torch.ones(2, 3)})
    out = union_tensor_dict(a, TensorBatch({"x": torch.ones(2, 3), "y": torch.zeros(2)}))
    assert out is a and sorted(a) == ["x", "y"]
    with pytest.raises(ValueError, match="key 'x' holds different tensors"):
        union_tensor_dict(a, TensorBatch({"x": torch.zeros(2, 3)}))
    with pytest.raises(ValueError, match=r"batch sizes \(2,\) and \(3,\) differ"):
        union_tensor_dict(a, TensorBatch({"z": torch.zeros(3)}))


def test_union_numpy_dict_treats_nan_as_equal_and_compares_objects():
    a = {"f": np.array([1.0, np.nan]), "o": np.array([[1, 2], "s"], dtype=object)}
    out = union_numpy_dict(a, {"f": np.array([1.0, np.nan]), "o": np.array([[1, 2], "s"], dtype=object),
                               "new": np.array([3])})
    assert out is a and sorted(a) == ["f", "new", "o"]
    with pytest.raises(ValueError, match="key 'o' holds different arrays"):
        union_numpy_dict(a, {"o": np.array([[1, 3], "s"], dtype=object)})


def test_list_of_dict_to_dict_of_list():
    assert list_of_dict_to_dict_of_list([{"a": 1, "b": 2}, {"a": 3, "b": 4}]) == {"a": [1, 3], "b": [2, 4]}
    assert list_of_dict_to_dict_of_list([]) == {}


def test_fold_and_unfold_batch_dim():
    d = rows(4)
    folded = fold_batch_dim(d, 2)
    assert folded.batch["x"].tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert folded.non_tensor_batch["uid"].tolist() == [["u0", "u1"], ["u2", "u3"]] and len(folded) == 2
    back = unfold_batch_dim(folded, batch_dims=2)
    assert torch.equal(back.batch["x"], d.batch["x"]) and back.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2",
                                                                                                  "u3"]
    with pytest.raises(ValueError, match="4 rows do not fold into 3"):
        fold_batch_dim(d, 3)


def test_serialize_round_trips_dtypes_and_nested_tensors():
    t = torch.tensor([[1.5, -2.0], [0.25, 8.0]], dtype=torch.bfloat16)
    dtype, shape, data = serialize_single_tensor(t)
    assert dtype == "bfloat16" and tuple(shape) == (2, 2) and data.dtype == np.uint8 and data.size == 8
    assert torch.equal(deserialize_single_tensor((dtype, shape, data)), t)
    nested = torch.nested.as_nested_tensor([torch.arange(2.0), torch.arange(3.0)], layout=torch.jagged)
    batch = TensorBatch({"a": torch.arange(6).reshape(2, 3), "n": nested})
    size, device, items = serialize_tensordict(batch)
    assert size == (2,) and device == "cpu" and items["n"][0] == "jagged"
    back = deserialize_tensordict((size, device, items))
    assert torch.equal(back["a"], batch["a"]) and [t.tolist() for t in back["n"].unbind()] == [[0, 1], [0, 1, 2]]


def test_from_dict_num_batch_dims_and_auto_padding_chunk():
    d = DataProto.from_dict({"x": torch.zeros(2, 3, 4), "y": torch.ones(2, 3)}, num_batch_dims=2)
    assert d.batch.batch_size == torch.Size([2, 3]) and len(d) == 2
    with pytest.raises(ValueError, match="first 2 dim"):
        DataProto.from_dict({"x": torch.zeros(2, 3), "y": torch.ones(2, 4)}, num_batch_dims=2)
    with pytest.raises(ValueError, match="rows do not split into 2"):
        rows(5).chunk(2)
    padded = DataProto.from_dict({"x": torch.arange(5)}, auto_padding=True)
    assert padded.is_padding_enabled() and [p.batch["x"].tolist() for p in padded.chunk(2)] == [[0, 1, 2], [3, 4]]
    DataProtoConfig.auto_padding = True
    try:
        assert [len(p) for p in rows(7).chunk(3)] == [3, 3, 1]  # torch.chunk's cut
    finally:
        DataProtoConfig.auto_padding = False
    assert not rows(5).is_padding_enabled()


def test_padding_sample_level_repeat_unfold_column_chunks():
    d = rows(3)
    d.padding(2)  # the last row twice
    assert d.batch["x"][:, 0].tolist() == [0, 2, 4, 4, 4] and d.non_tensor_batch["uid"].tolist()[-1] == "u2"
    d = rows(3)
    d.padding(1, "first")
    assert d.batch["x"][:, 0].tolist() == [0, 2, 4, 0]
    r = rows(3).sample_level_repeat([2, 0, 3])
    assert r.batch["x"][:, 0].tolist() == [0, 0, 4, 4, 4] and r.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u2",
                                                                                                   "u2", "u2"]
    assert len(rows(2).sample_level_repeat(torch.tensor([1, 2]))) == 3
    with pytest.raises(ValueError, match="need 3 counts"):
        rows(3).sample_level_repeat([1, 2])
    u = rows(2).unfold_column_chunks(2, split_keys=["x"])
    assert u.batch["x"].tolist() == [[0], [1], [2], [3]] and u.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u1",
                                                                                                  "u1"]


def test_concat_merges_meta_info_and_flattens_worker_metrics():
    a, b = rows(2), rows(2)
    a.meta_info["metrics"] = [{"loss": 1.0}, {"loss": 2.0}]  # one dict per worker
    b.meta_info["metrics"] = {"loss": [3.0, 4.0]}
    merged = DataProto.concat([a, b]).meta_info
    assert merged == {"t": 1.0, "metrics": {"loss": [1.0, 2.0, 3.0, 4.0]}}
    b.meta_info["t"] = 0.5
    with pytest.raises(ValueError, match=r"meta_info\['t'\] is 1.0 in an earlier part but 0.5 in part 1"):
        DataProto.concat([a, b])
    c = rows(2)
    c.meta_info["only_here"] = 1
    assert DataProto.concat([rows(2), c]).meta_info["only_here"] == 1  # a key in one part is kept


def test_empty_tensor_batch_keeps_its_rows_through_pickling():
    d = rows(3)
    d.pop(batch_keys=["x"], non_tensor_batch_keys=["uid"])
    assert len(d) == 3 and d.batch.batch_size == torch.Size([3])
    back = pickle.loads(pickle.dumps(d))
    assert len(back) == 3 and back.batch.batch_size == torch.Size([3]) and back.meta_info == {"t": 1.0}
    only_np = DataProto.from_dict(non_tensors={"uid": np.array(["a", "b"], dtype=object)})
    assert pickle.loads(pickle.dumps(only_np)).batch.batch_size == torch.Size([2])
    assert len(DataProto.concat([d, d])) == 6 and len(d.slice(1, 3)) == 2


def test_to_tensordict_names_its_package():
    try:
        import tensordict  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="needs the tensordict package"):
            rows(2).to_tensordict()
    else:
        td = rows(2).to_tensordict()
        assert td.batch_size == torch.Size([2]) and td["x"].tolist() == [[0, 1], [2, 3]]
