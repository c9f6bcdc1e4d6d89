"""DataProto: construction, every row/key operation, padding, iteration, pickling."""

import pickle

import numpy as np
import pytest
import torch

from rlpost.keys import ATTENTION_MASK, INPUT_IDS, META_METRICS, META_TEMPERATURE, UID, VALUES
from rlpost.protocol import DataProto, DataProtoFuture, DataProtoItem, pad_dataproto_to_divisor, unpad_dataproto


def make(n: int = 4) -> DataProto:
    return DataProto.from_dict(
        {INPUT_IDS: torch.arange(n * 2).view(n, 2), ATTENTION_MASK: torch.ones(n, 2)},
        {UID: [f"u{i}" for i in range(n)]},
        {META_TEMPERATURE: 1.0},
    )


def ids(d: DataProto) -> list:
    return d.batch[INPUT_IDS][:, 0].tolist()


def test_from_single_dict_splits_by_type_and_len():
    d = DataProto.from_single_dict({INPUT_IDS: torch.zeros(3, 5), UID: np.array(["a", "b", "c"], dtype=object),
                                    "tags": [[1], [2, 3], []]})
    assert list(d.batch) == [INPUT_IDS] and sorted(d.non_tensor_batch) == ["tags", UID]
    assert len(d) == 3 and d.batch.batch_size == torch.Size([3])
    assert d.non_tensor_batch["tags"].dtype == object and d.non_tensor_batch["tags"][1] == [2, 3]
    with pytest.raises(TypeError, match="'bad'"):
        DataProto.from_single_dict({"bad": 3})


def test_check_consistency_names_the_key():
    with pytest.raises(ValueError, match=r"\['values'\] has 2 rows but 'input_ids' has 3"):
        DataProto.from_dict({INPUT_IDS: torch.zeros(3, 1), VALUES: torch.zeros(2, 1)})
    with pytest.raises(ValueError, match=r"non_tensor_batch\['uid'\] has 1 rows"):
        DataProto.from_dict({INPUT_IDS: torch.zeros(3, 1)}, {UID: ["x"]})
    assert len(DataProto()) == 0 and len(DataProto.from_dict(non_tensors={UID: ["a", "b"]})) == 2


def test_select_pop_rename():
    d = make()
    s = d.select(batch_keys=[INPUT_IDS], non_tensor_batch_keys=[], meta_info_keys=[])
    assert list(s.batch) == [INPUT_IDS] and s.non_tensor_batch == {} and s.meta_info == {}
    assert s.batch[INPUT_IDS] is d.batch[INPUT_IDS]
    assert d.select(deepcopy=True).batch[INPUT_IDS] is not d.batch[INPUT_IDS]
    with pytest.raises(KeyError, match="no key"):
        d.select(batch_keys=[VALUES])
    popped = d.pop(batch_keys=[ATTENTION_MASK], non_tensor_batch_keys=[UID])
    assert list(d.batch) == [INPUT_IDS] and d.non_tensor_batch == {}
    assert list(popped.batch) == [ATTENTION_MASK] and list(popped.non_tensor_batch[UID]) == ["u0", "u1", "u2", "u3"]
    d.rename(INPUT_IDS, VALUES)
    assert list(d.batch) == [VALUES]


def test_union_merges_and_rejects_conflicts():
    d = make()
    other = DataProto.from_dict({VALUES: torch.ones(4, 1), INPUT_IDS: d.batch[INPUT_IDS].clone()}, meta_info={"k": 1})
    out = d.union(other)
    assert out is d and sorted(d.batch) == sorted([INPUT_IDS, ATTENTION_MASK, VALUES]) and d.meta_info["k"] == 1
    with pytest.raises(ValueError, match=r"batch\['input_ids'\] differs"):
        d.union(DataProto.from_dict({INPUT_IDS: torch.zeros(4, 2, dtype=torch.long)}))
    with pytest.raises(ValueError, match=r"non_tensor_batch\['uid'\] differs"):
        d.union(DataProto.from_dict(non_tensors={UID: ["x"] * 4}))
    with pytest.raises(ValueError, match=r"meta_info\['temperature'\] differs"):
        d.union(DataProto(meta_info={META_TEMPERATURE: 0.5}))
    with pytest.raises(ValueError, match="4 rows vs 2 rows"):
        d.union(make(2).select(batch_keys=[], non_tensor_batch_keys=[UID]))


def test_repeat_interleave_and_tile():
    d = make(2)
    assert ids(d.repeat(2, interleave=True)) == [0, 0, 2, 2]
    assert list(d.repeat(2, interleave=True).non_tensor_batch[UID]) == ["u0", "u0", "u1", "u1"]
    assert ids(d.repeat(3, interleave=False)) == [0, 2, 0, 2, 0, 2]
    assert list(d.repeat(2, interleave=False).non_tensor_batch[UID]) == ["u0", "u1", "u0", "u1"]


def test_chunk_split_concat():
    d = make(6)
    parts = d.chunk(3)
    assert [ids(p) for p in parts] == [[0, 2], [4, 6], [8, 10]] and parts[1].meta_info == d.meta_info
    with pytest.raises(ValueError, match="6 rows do not split into 4"):
        d.chunk(4)
    assert [len(p) for p in d.split(4)] == [4, 2]
    back = DataProto.concat(parts)
    assert torch.equal(back.batch[INPUT_IDS], d.batch[INPUT_IDS]) and list(back.non_tensor_batch[UID]) == [
        f"u{i}" for i in range(6)
    ]
    parts[0].meta_info[META_METRICS] = {"loss": 1.0, "lr": [0.1, 0.2]}
    parts[2].meta_info[META_METRICS] = {"loss": [3.0]}
    merged = DataProto.concat(parts).meta_info
    assert merged[META_METRICS] == {"loss": [1.0, 3.0], "lr": [0.1, 0.2]} and merged[META_TEMPERATURE] == 1.0
    with pytest.raises(KeyError, match="part 1 has keys"):
        DataProto.concat([d, d.select(batch_keys=[INPUT_IDS])])


def test_indexing_reorder_select_idxs():
    d = make(5)
    item = d[1]
    assert isinstance(item, DataProtoItem) and item.batch[INPUT_IDS].tolist() == [2, 3] and item.non_tensor_batch[UID] == "u1"
    assert ids(d[1:3]) == [2, 4] and ids(d.slice(0, 5, 2)) == [0, 4, 8]
    assert ids(d[[4, 0]]) == [8, 0] and ids(d[np.array([3])]) == [6]
    sel = d.select_idxs(torch.tensor([True, False, True, False, False]))
    assert ids(sel) == [0, 4] and list(sel.non_tensor_batch[UID]) == ["u0", "u2"]
    d.reorder(torch.tensor([4, 3, 2, 1, 0]))
    assert ids(d) == [8, 6, 4, 2, 0] and list(d.non_tensor_batch[UID]) == ["u4", "u3", "u2", "u1", "u0"]


@pytest.mark.parametrize("n,k,pad", [(5, 4, 3), (8, 4, 0), (1, 4, 3), (3, 2, 1)])
def test_pad_and_unpad(n, k, pad):
    d = make(n)
    padded, pad_size = pad_dataproto_to_divisor(d, k)
    assert pad_size == pad and len(padded) % k == 0
    assert ids(padded)[n:] == [2 * (i % n) for i in range(pad)]  # copies of the first rows, cyclically
    assert ids(unpad_dataproto(padded, pad_size)) == ids(d)


def test_make_iterator_is_deterministic_and_covers_rows():
    d = make(8)
    order = [ids(b) for b in d.make_iterator(4, epochs=2, seed=7, dataloader_kwargs={"shuffle": True})]
    again = [ids(b) for b in d.make_iterator(4, epochs=2, seed=7, dataloader_kwargs={"shuffle": True})]
    assert order == again and len(order) == 4 and all(len(b) == 4 for b in order)
    assert sorted(order[0] + order[1]) == ids(d) and order[:2] != order[2:]  # each epoch a new permutation
    assert [ids(b) for b in d.make_iterator(4, epochs=1)] == [[0, 2, 4, 6], [8, 10, 12, 14]]
    with pytest.raises(ValueError, match="not divisible by mini_batch_size 3"):
        d.make_iterator(3, epochs=1)
    with pytest.raises(ValueError, match="not supported yet: dataloader_kwargs"):
        d.make_iterator(4, epochs=1, dataloader_kwargs={"num_workers": 2})


def test_to_device_and_repr(capsys):
    d = make(2).to("cpu")
    assert d.batch[INPUT_IDS].device.type == "cpu"
    assert "len=2" in repr(d) and "input_ids: (2, 2)" in repr(d)
    d.print_size()
    assert "MiB" in capsys.readouterr().out


def test_pickle_sends_only_the_slice():
    big = DataProto.from_dict({VALUES: torch.zeros(10_000, 100)})
    part = big.slice(0, 10)
    blob = pickle.dumps(part)
    assert len(blob) < 20_000  # 10 rows x 100 floats, not the 4 MB storage
    back = pickle.loads(blob)
    assert back.batch[VALUES].shape == (10, 100) and back.batch.batch_size == torch.Size([10])


WIRE_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
               torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64, torch.bool, torch.complex64,
               torch.float8_e4m3fn, torch.float8_e5m2]


def _ray_like(data: DataProto) -> tuple[DataProto, int, int]:
    """Pickle as Ray does (protocol 5, buffers out of band), hand the buffers back read-only as Ray's shared
    memory does; returns the copy, the in-band size and the out-of-band size."""
    buffers = []
    blob = pickle.dumps(data, protocol=5, buffer_callback=buffers.append)
    back = pickle.loads(blob, buffers=[memoryview(bytes(b.raw())) for b in buffers])
    return back, len(blob), sum(b.raw().nbytes for b in buffers)


@pytest.mark.parametrize("dtype", WIRE_DTYPES, ids=str)
def test_pickle_round_trips_every_dtype(dtype):
    """CPU tensors travel as numpy arrays (bf16, float8, ... as integers of their width), buffers out of band;
    the copy is bit for bit, writable and its own memory."""
    bits = torch.randint(0, 256, (6, 8 * torch.empty(0, dtype=dtype).element_size()), dtype=torch.uint8)
    t = bits.view(dtype) if dtype != torch.bool else bits > 127
    part = DataProto.from_dict({"t": t}).slice(2, 5)
    back, inband, outband = _ray_like(part)
    got = back.batch["t"]
    assert got.dtype == dtype and got.shape == (3, 8)
    assert torch.equal(got.view(torch.uint8), part.batch["t"].view(torch.uint8))
    assert outband == 3 * 8 * t.element_size() and inband < 2048  # only the slice's bytes, out of band
    sent = part.batch["t"].clone()
    got.view(torch.uint8).zero_()
    assert torch.equal(part.batch["t"].view(torch.uint8), sent.view(torch.uint8))


def test_pickle_round_trips_views_empty_grad_and_old_pickles():
    base = torch.randn(6, 8)
    tensors = {"columns": base[:, ::2], "transposed": torch.randn(8, 6).t(), "broadcast": torch.arange(4.0).expand(6, 4),
               "empty": torch.zeros(6, 0), "grad": base.clone().requires_grad_(True)}
    data = DataProto.from_dict(tensors)
    back, inband, _ = _ray_like(data)
    for key, t in data.batch.items():
        assert back.batch[key].dtype == t.dtype and torch.equal(back.batch[key], t.detach()), key
    assert back.batch["grad"].requires_grad  # autograd leaves keep torch's pickling
    assert inband < 4096  # the broadcast view travels as its 4 values, not 6 x 4
    # a pickle written before the numpy wire format (raw tensors in the state) still loads
    old = DataProto.__new__(DataProto)
    old.__setstate__({"batch": {VALUES: base}, "non_tensor_batch": {}, "meta_info": {"k": 1}})
    again = pickle.loads(pickle.dumps(old))  # in-band (protocol 4, e.g. save_to_disk)
    assert torch.equal(again.batch[VALUES], base) and again.meta_info == {"k": 1}


def test_future_get_applies_collect_and_dispatch():
    fut = DataProtoFuture(collect_fn=DataProto.concat, futures=["a", "b"], dispatch_fn=len,
                          fetch_fn=lambda refs: [make(2) for _ in refs])
    assert fut.get() == 4
