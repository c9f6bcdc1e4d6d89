"""`@register`: how a worker method's arguments are spread over a group and its results gathered.

The decorator only tags the function, so the method stays an ordinary method on a plain instance.
The functions below (`plan_calls`, `collect_fn_for`) are pure: the Ray worker group uses them, and
tests can check them without Ray.

Data-parallel layout: every rank reports `(dp_rank, dp_size, is_collect)`. Ranks with the same
dp_rank (e.g. tensor-parallel peers) receive the same shard; only the one with is_collect=True
has its result returned.

Dispatch modes of one's own (verl's API): `register_dispatch_mode(name, dispatch_fn, collect_fn)` adds
`Dispatch.<name>`; `update_dispatch_mode` replaces the functions of a mode (a built-in one included);
`@register(dispatch_mode={"dispatch_fn": ..., "collect_fn": ...})` uses functions directly. They take the
worker group: `dispatch_fn(worker_group, *args, **kwargs) -> (args, kwargs)` with every value a list of one
item per rank, and `collect_fn(worker_group, outputs) -> result`. `make_nd_compute_dataproto_dispatch_fn(mesh)`
builds such a pair from what each rank declared with `Worker._register_dispatch_collect_info(mesh, ...)`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Sequence

from rlpost.protocol import DataProto, DataProtoFuture, pad_dataproto_to_divisor

MAGIC_ATTR = "_rlpost_register"


class Dispatch(Enum):
    ONE_TO_ALL = "one_to_all"  # same arguments to every rank; list of all results
    ALL_TO_ALL = "all_to_all"  # each argument a list of world_size items, item i to rank i; list of results
    RANK_ZERO = "rank_zero"  # only rank 0 runs; its result
    DP_COMPUTE = "dp_compute"  # each argument a list of dp_size items; list of dp_size results
    DP_COMPUTE_PROTO = "dp_compute_proto"  # DataProto split over dp ranks (padded); results concatenated
    DP_COMPUTE_PROTO_WITH_FUNC = "dp_compute_proto_with_func"  # first arg a function sent to all, rest as above
    DP_COMPUTE_METRIC = "dp_compute_metric"  # DataProto split (must divide); list of dp_size results


class Execute(Enum):
    ALL = "all"
    RANK_ZERO = "rank_zero"


class DispatchMode:
    """A dispatch mode added by `register_dispatch_mode` (reachable as `Dispatch.<name>`)."""

    def __init__(self, name: str) -> None:
        self.name, self.value = name, name.lower()

    def __repr__(self) -> str:
        return f"<Dispatch.{self.name} (registered)>"


# Functions of the modes registered or updated by the user; the built-in modes without an entry here run
# through `plan_calls` / `collect_fn_for`.
DISPATCH_MODE_FN_REGISTRY: dict[Any, dict[str, Callable]] = {}


def _check_fns(mode: Any, fns: Any) -> dict[str, Callable]:
    if not (isinstance(fns, dict) and all(callable(fns.get(k)) for k in ("dispatch_fn", "collect_fn"))):
        raise ValueError(f"dispatch mode {mode!r}: give a dict with callables 'dispatch_fn' and 'collect_fn', "
                         f"got {fns!r}")
    return {"dispatch_fn": fns["dispatch_fn"], "collect_fn": fns["collect_fn"]}


def register_dispatch_mode(dispatch_mode_name: str, dispatch_fn: Callable, collect_fn: Callable) -> DispatchMode:
    """Add `Dispatch.<dispatch_mode_name>` with these functions (see the module docstring for their contract)."""
    if not dispatch_mode_name.isidentifier() or hasattr(Dispatch, dispatch_mode_name):
        raise ValueError(f"register_dispatch_mode: {dispatch_mode_name!r} already exists or is not a name")
    mode = DispatchMode(dispatch_mode_name)
    fns = _check_fns(mode, {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn})
    setattr(Dispatch, dispatch_mode_name, mode)  # a new attribute, not an Enum member: verl's Dispatch.<name>
    DISPATCH_MODE_FN_REGISTRY[mode] = fns
    return mode


def update_dispatch_mode(dispatch_mode: Dispatch | DispatchMode, dispatch_fn: Callable, collect_fn: Callable) -> None:
    """Replace the functions of an existing dispatch mode (built-in or registered); applies from the next call."""
    if not isinstance(dispatch_mode, (Dispatch, DispatchMode)):
        raise ValueError(f"update_dispatch_mode: {dispatch_mode!r} is not a Dispatch mode")
    DISPATCH_MODE_FN_REGISTRY[dispatch_mode] = _check_fns(dispatch_mode, {"dispatch_fn": dispatch_fn,
                                                                          "collect_fn": collect_fn})


def custom_fns(dispatch_mode: Any) -> dict[str, Callable] | None:
    """The user's functions for this mode (a dict mode, a registered or updated mode), or None for built-ins."""
    if isinstance(dispatch_mode, dict):
        return dispatch_mode
    return DISPATCH_MODE_FN_REGISTRY.get(dispatch_mode)


def _mesh_dispatch(mesh_name: str, worker_group: Any, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    """Each DataProto argument cut into one chunk per dp rank of `mesh_name`; each rank gets its dp rank's chunk."""
    mapping = worker_group.mesh_dispatch_info(mesh_name)
    dp_size = max(mapping) + 1

    def per_rank(value: Any) -> list:
        if isinstance(value, DataProtoFuture):
            raise ValueError(f"mesh {mesh_name!r} dispatch: not supported yet: a DataProtoFuture argument "
                             "(call .get() first)")
        chunks = value.chunk(dp_size) if isinstance(value, DataProto) else [value] * dp_size
        return [chunks[dp] for dp in mapping]

    return tuple(per_rank(a) for a in args), {k: per_rank(v) for k, v in kwargs.items()}


def _mesh_collect(mesh_name: str, worker_group: Any, output: list) -> Any:
    """The outputs of the collecting ranks of `mesh_name`, in rank order; DataProtos concatenated."""
    mask = worker_group.mesh_collect_info(mesh_name)
    kept = [o for o, keep in zip(output, mask) if keep]
    return DataProto.concat(kept) if kept and all(isinstance(o, DataProto) for o in kept) else kept


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> dict[str, Callable]:
    """A dict dispatch mode over the data-parallel ranks that the workers declared for `mesh_name`
    (`Worker._register_dispatch_collect_info`): DataProtos split by dp rank, collecting ranks' results joined."""
    return {"dispatch_fn": functools.partial(_mesh_dispatch, mesh_name),
            "collect_fn": functools.partial(_mesh_collect, mesh_name)}


_DP_MODES = {
    Dispatch.DP_COMPUTE,
    Dispatch.DP_COMPUTE_PROTO,
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC,
    Dispatch.DP_COMPUTE_METRIC,
}


@dataclass(frozen=True)
class RegisterInfo:
    dispatch_mode: Dispatch | DispatchMode | dict
    execute_mode: Execute
    blocking: bool

    @property
    def uses_dp_layout(self) -> bool:
        return (isinstance(self.dispatch_mode, Dispatch) and self.dispatch_mode in _DP_MODES
                and self.execute_mode == Execute.ALL)


def register(
    dispatch_mode: Dispatch = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
) -> Callable:
    """Mark a worker method as callable on a worker group.

    Args:
        dispatch_mode: how arguments are spread and results gathered: a `Dispatch` mode (built-in or from
            `register_dispatch_mode`), or a dict {"dispatch_fn", "collect_fn"} (see the module docstring).
        execute_mode: `Execute.ALL` ranks, or `Execute.RANK_ZERO` only.
        blocking: False makes the group call return a `DataProtoFuture` at once. Such a method must not
            change the rank's data-parallel layout (the group keeps the layout it asked for before).
        materialize_futures: kept for verl compatibility; futures are always resolved on the worker.
    """
    if isinstance(dispatch_mode, dict):
        dispatch_mode = _check_fns("given as a dict", dispatch_mode)
    elif not isinstance(dispatch_mode, (Dispatch, DispatchMode)):
        raise ValueError(f"dispatch_mode={dispatch_mode!r}: use a Dispatch mode or a dict with 'dispatch_fn' and "
                         "'collect_fn'")
    if not isinstance(execute_mode, Execute):
        raise ValueError(f"not supported yet: execute_mode={execute_mode!r} (use an Execute member)")
    if not materialize_futures:
        raise ValueError("not supported yet: register(materialize_futures=False)")

    def decorator(func: Callable) -> Callable:
        setattr(func, MAGIC_ATTR, RegisterInfo(dispatch_mode, execute_mode, blocking))
        return func

    return decorator


def registered_methods(cls: type) -> dict[str, RegisterInfo]:
    """{method name: RegisterInfo} for every @register-ed method of `cls` (inherited ones included)."""
    out = {}
    for name in dir(cls):
        info = getattr(getattr(cls, name, None), MAGIC_ATTR, None)
        if isinstance(info, RegisterInfo):
            out[name] = info
    return out


@dataclass(frozen=True)
class DpLayout:
    """Per rank: its data-parallel rank and whether its result is returned."""

    dp_rank: tuple[int, ...]
    dp_size: int
    collect: tuple[bool, ...]

    @staticmethod
    def plain(world_size: int) -> DpLayout:
        return DpLayout(tuple(range(world_size)), world_size, (True,) * world_size)

    @staticmethod
    def from_reports(reports: Sequence[tuple[int, int, bool]]) -> DpLayout:
        """Validate the (dp_rank, dp_size, is_collect) reported by each rank."""
        sizes = {r[1] for r in reports}
        if len(sizes) != 1:
            raise ValueError(f"workers report different dp sizes: {sorted(sizes)}")
        dp_size = sizes.pop()
        for dp in range(dp_size):
            n_collect = sum(1 for r in reports if r[0] == dp and r[2])
            if n_collect != 1:
                raise ValueError(f"dp rank {dp} has {n_collect} collecting workers; it needs exactly 1")
        if any(not 0 <= r[0] < dp_size for r in reports):
            raise ValueError(f"a dp rank is outside [0, {dp_size}): {[r[0] for r in reports]}")
        return DpLayout(tuple(r[0] for r in reports), dp_size, tuple(bool(r[2]) for r in reports))

    def collect_ranks(self) -> list[int]:
        """Global ranks whose results are returned, ordered by dp rank."""
        return sorted((r for r, c in enumerate(self.collect) if c), key=lambda r: self.dp_rank[r])


@dataclass
class RankCall:
    rank: int
    args: tuple
    kwargs: dict
    trim: int = 0  # padding rows at the end of this rank's DataProto shard


@dataclass
class FutureShard:
    """Shard `index` of `parts` of a DataProtoFuture; the receiving worker resolves it."""

    future: DataProtoFuture
    index: int
    parts: int

    def resolve(self) -> tuple[DataProto, int]:
        """(this worker's shard, number of padding rows at its end)."""
        chunks, trims = shard_with_padding(self.future.get(), self.parts)
        return chunks[self.index], trims[self.index]


def shard_with_padding(data: DataProto, parts: int) -> tuple[list[DataProto], list[int]]:
    """Pad `data` to a multiple of `parts` and chunk it; also the padding rows in each chunk."""
    n = len(data)
    padded, _ = pad_dataproto_to_divisor(data, parts)
    size = len(padded) // parts
    trims = [max(0, min(size, (i + 1) * size - n)) for i in range(parts)]
    return padded.chunk(parts), trims


def trim_output(output: Any, trim: int, rows_in: int) -> Any:
    """Drop the rows a worker computed for padding (output must be one row per input row)."""
    if not trim or not isinstance(output, DataProto):
        return output
    if len(output) != rows_in:
        raise ValueError(
            f"cannot strip {trim} padding rows: the method returned {len(output)} rows for {rows_in} input rows"
        )
    return output.slice(0, rows_in - trim)


def _split_proto_args(
    args: tuple, kwargs: dict, dp_size: int, pad: bool
) -> tuple[list[tuple], list[dict], list[int]]:
    """Per dp rank: args and kwargs with each DataProto replaced by its shard; other values shared."""
    values = list(args) + list(kwargs.values())
    lengths = {len(v) for v in values if isinstance(v, DataProto)}
    if len(lengths) > 1:
        raise ValueError(f"DataProto arguments have different lengths: {sorted(lengths)}")
    rows = next(iter(lengths), 0)
    if not pad and rows % dp_size:
        raise ValueError(f"batch of {rows} rows is not divisible by dp size {dp_size} (this mode does not pad)")
    shards, trims = [], [0] * dp_size
    for value in values:
        if isinstance(value, DataProto):
            chunks, trims = shard_with_padding(value, dp_size)
            shards.append(chunks)
        elif isinstance(value, DataProtoFuture):
            shards.append([FutureShard(value, i, dp_size) for i in range(dp_size)])
        else:
            shards.append([value] * dp_size)
    n_args = len(args)
    per_args = [tuple(s[i] for s in shards[:n_args]) for i in range(dp_size)]
    per_kwargs = [dict(zip(kwargs, (s[i] for s in shards[n_args:]))) for i in range(dp_size)]
    return per_args, per_kwargs, trims


def _split_lists(args: tuple, kwargs: dict, n: int, what: str) -> tuple[list[tuple], list[dict]]:
    for value in list(args) + list(kwargs.values()):
        if not isinstance(value, (list, tuple)) or len(value) != n:
            raise ValueError(f"{what}: every argument must be a list of {n} items, got {type(value).__name__}")
    return (
        [tuple(a[i] for a in args) for i in range(n)],
        [{k: v[i] for k, v in kwargs.items()} for i in range(n)],
    )


def plan_calls(info: RegisterInfo, layout: DpLayout, args: tuple, kwargs: dict) -> list[RankCall]:
    """The calls to make, one per rank that runs, with that rank's arguments."""
    world = len(layout.dp_rank)
    mode = info.dispatch_mode
    if info.execute_mode == Execute.RANK_ZERO or mode == Dispatch.RANK_ZERO:
        return [RankCall(0, args, kwargs)]
    if mode == Dispatch.ONE_TO_ALL:
        return [RankCall(r, args, kwargs) for r in range(world)]
    if mode == Dispatch.ALL_TO_ALL:
        per_args, per_kwargs = _split_lists(args, kwargs, world, mode.name)
        return [RankCall(r, per_args[r], per_kwargs[r]) for r in range(world)]
    if mode == Dispatch.DP_COMPUTE:
        per_args, per_kwargs = _split_lists(args, kwargs, layout.dp_size, mode.name)
        trims = [0] * layout.dp_size
    else:
        if mode == Dispatch.DP_COMPUTE_PROTO_WITH_FUNC and not (args and callable(args[0])):
            raise ValueError("DP_COMPUTE_PROTO_WITH_FUNC: the first argument must be a function")
        pad = mode != Dispatch.DP_COMPUTE_METRIC
        per_args, per_kwargs, trims = _split_proto_args(args, kwargs, layout.dp_size, pad)
    return [
        RankCall(r, per_args[dp], per_kwargs[dp], trims[dp]) for r, dp in enumerate(layout.dp_rank)
    ]


def _concat_outputs(outputs: list) -> Any:
    if all(o is None for o in outputs):
        return None
    if not all(isinstance(o, DataProto) for o in outputs):
        kinds = sorted({type(o).__name__ for o in outputs})
        raise TypeError(f"DP_COMPUTE_PROTO methods must return DataProto on every rank, got {kinds}")
    return DataProto.concat(outputs)


def _first(outputs: list) -> Any:
    return outputs[0]


def _pick(indices: list[int], then: Callable[[list], Any], outputs: list) -> Any:
    return then([outputs[i] for i in indices])


def collect_fn_for(info: RegisterInfo, layout: DpLayout, called: list[int]) -> Callable[[list], Any]:
    """A picklable function from the outputs of `called` ranks (in that order) to the group result."""
    mode = info.dispatch_mode
    if info.execute_mode == Execute.RANK_ZERO or mode == Dispatch.RANK_ZERO:
        return _first
    if mode in (Dispatch.ONE_TO_ALL, Dispatch.ALL_TO_ALL):
        return list
    position = {rank: i for i, rank in enumerate(called)}
    indices = [position[r] for r in layout.collect_ranks()]
    then = list if mode in (Dispatch.DP_COMPUTE, Dispatch.DP_COMPUTE_METRIC) else _concat_outputs
    return functools.partial(_pick, indices, then)
