"""`rollout.over_sample_rate` in the rollout: once enough whole groups are done the engine requests still running
are aborted, on a scripted stepped engine whose finishing steps are known (a request finishes after as many
steps as its prompt has tokens), so which groups are kept and which requests are aborted is derived by hand."""

import asyncio

import pytest

from rlpost.rollout.over_sample import gather_first_groups, groups_to_keep
from test_async_engine import ScriptedEngine, params

pytestmark = pytest.mark.timeout(60)

# group -> finishing step of each of its 2 rows: A done at step 3, C at 4, D at 8 (its first row at 2), B at 9
STEPS = {"A": [3, 2], "B": [9, 9], "C": [1, 4], "D": [2, 8]}
UIDS = [g for g in STEPS for _ in range(2)]
PROMPTS = [list(range(10, 10 + n)) for g in STEPS for n in STEPS[g]]


def run(keep: int):
    engine = ScriptedEngine()

    async def main():
        return await gather_first_groups([engine.generate(p, params(4)) for p in PROMPTS], UIDS, keep)

    return asyncio.run(main()), engine


def test_half_the_groups_keeps_the_two_first_done_and_aborts_the_running_tail():
    out, engine = run(groups_to_keep(4, 0.5))  # ceil(0.5 * 4) = 2 groups: A (step 3) and C (step 4)
    assert out.cut == [False, False, True, True, False, False, True, True]
    # at step 4 B's two requests and D's second were running; D's first had finished at step 2 (dropped)
    assert out.aborted == [False, False, True, True, False, False, False, True]
    assert engine.steps == 4 and sorted(engine.aborted) == ["agent-2", "agent-3", "agent-7"]
    assert out.results[0] == ([12, 11, 10][:4], [0.0] * 3) and out.results[4] == ([10], [0.0])
    assert out.results[2] is None and out.results[6] is None


def test_three_quarters_keeps_d_and_aborts_only_b():
    out, engine = run(groups_to_keep(4, 0.25))  # ceil(0.75 * 4) = 3: A, C, then D at step 8
    assert out.cut == [False, False, True, True, False, False, False, False]
    assert out.aborted == [False, False, True, True, False, False, False, False]
    assert engine.steps == 8 and sorted(engine.aborted) == ["agent-2", "agent-3"]


def test_keep_counts_are_ceil_of_the_kept_share():
    assert [groups_to_keep(10, r) for r in (0.2, 0.3, 0.5, 0.95)] == [8, 7, 5, 1]  # 0.7 * 10 is 7.000000000000001
    assert groups_to_keep(3, 0.5) == 2 and groups_to_keep(1, 0.9) == 1


def test_an_engine_error_reaches_the_caller():
    engine = ScriptedEngine(fail_at_step=2)

    async def main():
        return await gather_first_groups([engine.generate(p, params(4)) for p in PROMPTS], UIDS, 2)

    with pytest.raises(RuntimeError, match="engine died"):
        asyncio.run(main())
