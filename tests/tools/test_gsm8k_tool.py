"""Gsm8kTool: rewards as verl's (score of the last answer; -0.05 step penalty when it did not improve)."""

import asyncio

from rlpost.tools.gsm8k_tool import Gsm8kTool


def test_rewards_over_submissions():
    tool = Gsm8kTool(config={}, tool_schema=None)
    assert tool.name == "calc_gsm8k_reward"

    async def go():
        iid, _ = await tool.create("t1", create_kwargs={"ground_truth": "72"})
        first = await tool.execute(iid, {"answer": "70"})  # wrong: 0.0, not better than 0.0 -> -0.05
        second = await tool.execute(iid, {"answer": "72"})  # right: 1.0 > 0.0 -> 0.0
        third = await tool.execute(iid, {"answer": "#### 72"})  # right again: not better -> -0.05
        final = await tool.calc_reward(iid)
        await tool.release(iid)
        return iid, first, second, third, final

    iid, first, second, third, final = asyncio.run(go())
    assert iid == "t1"
    assert (first[0].text, first[1]) == ("Current parsed answer='70' reward=0.0", -0.05)
    assert (second[0].text, second[1]) == ("Current parsed answer='72' reward=1.0", 0.0)
    assert third[1] == -0.05
    assert final == 1.0
    assert tool._instances == {}


def test_ground_truth_as_keyword_and_numeric_answer():
    tool = Gsm8kTool(config={}, tool_schema=None)

    async def go():
        iid, _ = await tool.create(ground_truth="1,000")
        response, step, _ = await tool.execute(iid, {"answer": 1000})
        return response.text, step, await tool.calc_reward(iid)

    assert asyncio.run(go()) == ("Current parsed answer='1000' reward=1.0", 0.0, 1.0)
