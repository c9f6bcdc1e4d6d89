"""@register and the Ray-free dispatch planning: layouts, padding trims, collection."""

import pytest
import torch

from rlpost.keys import INPUT_IDS
from rlpost.protocol import DataProto, DataProtoFuture
from rlpost.single_controller.base import Dispatch, Execute, Worker, register
from rlpost.single_controller.base.decorator import (
    DpLayout,
    FutureShard,
    RegisterInfo,
    collect_fn_for,
    plan_calls,
    registered_methods,
    shard_with_padding,
    trim_output,
)


class Doubler(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({INPUT_IDS: data.batch[INPUT_IDS] * 2})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self):
        return self.rank

    def helper(self):
        return 1


def rows(n: int) -> DataProto:
    return DataProto.from_dict({INPUT_IDS: torch.arange(n)})


def test_registered_method_stays_plain_callable():
    w = Doubler()
    assert (w.rank, w.world_size, w.local_rank, w.device) == (0, 1, 0, "cpu")
    assert w.double(rows(3)).batch[INPUT_IDS].tolist() == [0, 2, 4]
    methods = registered_methods(Doubler)
    # the two mesh queries come from Worker itself (verl's dispatch-collect registration)
    assert sorted(methods) == ["_query_collect_info", "_query_dispatch_info", "double", "init_model"]
    assert methods["init_model"].blocking is False
    with pytest.raises(ValueError, match="dispatch_mode='dp': use a Dispatch mode or a dict"):
        register(dispatch_mode="dp")


@pytest.mark.parametrize("n,trims", [(1, [0, 1, 1, 1]), (5, [0, 0, 1, 2]), (6, [0, 0, 0, 2]), (8, [0, 0, 0, 0])])
def test_shards_and_trims(n, trims):
    chunks, got = shard_with_padding(rows(n), 4)
    assert got == trims and len({len(c) for c in chunks}) == 1
    kept = [trim_output(c, t, len(c)) for c, t in zip(chunks, got)]
    assert torch.cat([k.batch[INPUT_IDS] for k in kept]).tolist() == list(range(n))


def test_trim_needs_one_row_per_input_row():
    with pytest.raises(ValueError, match="returned 4 rows for 2 input rows"):
        trim_output(rows(4), 1, 2)
    assert trim_output([1, 2], 1, 2) == [1, 2]  # non-DataProto results pass through


def test_plan_and_collect_with_tensor_parallel_peers():
    layout = DpLayout.from_reports([(0, 2, True), (0, 2, False), (1, 2, True), (1, 2, False)])
    info = RegisterInfo(Dispatch.DP_COMPUTE_PROTO, Execute.ALL, True)
    calls = plan_calls(info, layout, (rows(3),), {})
    assert [c.rank for c in calls] == [0, 1, 2, 3] and [c.trim for c in calls] == [0, 0, 1, 1]
    assert [c.args[0].batch[INPUT_IDS].tolist() for c in calls] == [[0, 1], [0, 1], [2, 0], [2, 0]]
    outputs = [trim_output(c.args[0], c.trim, 2) for c in calls]
    assert collect_fn_for(info, layout, [0, 1, 2, 3])(outputs).batch[INPUT_IDS].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="dp rank 1 has 2 collecting workers"):
        DpLayout.from_reports([(0, 2, True), (1, 2, True), (1, 2, True)])


def test_plan_modes():
    plain = DpLayout.plain(2)
    one = plan_calls(RegisterInfo(Dispatch.ONE_TO_ALL, Execute.RANK_ZERO, True), plain, (5,), {})
    assert [(c.rank, c.args) for c in one] == [(0, (5,))]
    a2a = plan_calls(RegisterInfo(Dispatch.ALL_TO_ALL, Execute.ALL, True), plain, ([1, 2],), {"k": ["a", "b"]})
    assert [(c.args, c.kwargs) for c in a2a] == [((1,), {"k": "a"}), ((2,), {"k": "b"})]
    fut = DataProtoFuture(collect_fn=list, futures=[])
    shards = plan_calls(RegisterInfo(Dispatch.DP_COMPUTE_PROTO, Execute.ALL, True), plain, (fut, 7), {})
    assert [type(c.args[0]) for c in shards] == [FutureShard] * 2 and [c.args[1] for c in shards] == [7, 7]
    with pytest.raises(ValueError, match="first argument must be a function"):
        plan_calls(RegisterInfo(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC, Execute.ALL, True), plain, (rows(2),), {})
    with pytest.raises(ValueError, match="different lengths"):
        plan_calls(RegisterInfo(Dispatch.DP_COMPUTE_PROTO, Execute.ALL, True), plain, (rows(2), rows(3)), {})
