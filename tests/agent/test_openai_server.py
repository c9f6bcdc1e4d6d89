"""The OpenAI-compatible endpoint over a real tiny vLLM CPU engine, called with the real `openai` client: a
conversation becomes the trajectory an in-process agent loop builds (same ids, masks and log-probs), streaming
gives the same text, completions continue token-exactly, and bad requests get clear errors. Tool calls (a random
model never writes one) come from a scripted engine."""

import asyncio

import pytest

from _agent_doubles import ScriptedEngine, call, schema
from rlpost.agent.openai_server import OpenAIServer
from rlpost.agent.trajectory import TrajectoryBuilder, decode, encode
from rlpost.rollout.async_engine import sampling_kwargs
from rlpost.rollout.base import SamplingSpec

pytestmark = pytest.mark.timeout(300)

GREEDY = SamplingSpec(greedy=True, temperature=0.0, top_k=-1, top_p=1.0, max_tokens=40, ignore_eos=False,
                      logprobs=True)
R = 40  # response budget of a trajectory


def serve(generate, tok, body):
    """Run `body(server, client_for)` against a started server; client_for(tid) is an AsyncOpenAI client whose
    base URL names the trajectory."""
    from openai import AsyncOpenAI

    async def main():
        server = OpenAIServer(generate, tok, sampling_kwargs(GREEDY), R)
        await server.start()
        try:
            return await body(server, lambda tid: AsyncOpenAI(base_url=server.base_url(tid), api_key="x",
                                                              max_retries=0))
        finally:
            await server.aclose()

    return asyncio.run(main())


USER = [{"role": "user", "content": "What is 2 + 3?"}]
FOLLOW_UP = {"role": "user", "content": "Check it."}


def test_chat_trajectory_is_the_in_process_one_and_the_stream_gives_the_same_text(vllm_engine):
    engine, tok = vllm_engine

    async def body(server, client_for):
        tid = server.open()
        client = client_for(tid)
        first = await client.chat.completions.create(model="m", messages=USER, max_tokens=6, logprobs=True)
        messages = USER + [{"role": "assistant", "content": first.choices[0].message.content}, FOLLOW_UP]
        stream = await client.chat.completions.create(model="m", messages=messages, max_tokens=8, stream=True)
        streamed = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
        record = server.close(tid)
        return first, "".join(streamed), record, server.trajectory(record)

    async def in_process():  # what an agent loop does with the same engine and messages
        builder = TrajectoryBuilder(tok, USER, R)
        ids, lps = await engine.generate(builder.prompt_ids, {**sampling_kwargs(GREEDY), "max_tokens": 6})
        builder.add_model_turn(ids, lps)
        builder.add_messages([FOLLOW_UP])
        ids2, lps2 = await engine.generate(builder.prompt_ids + builder.response_ids,
                                           {**sampling_kwargs(GREEDY), "max_tokens": 8})
        builder.add_model_turn(ids2, lps2)
        return builder.result("disable"), ids, ids2

    expected, ids1, ids2 = asyncio.run(in_process())
    first, streamed, record, out = serve(engine.generate, tok, body)
    assert first.choices[0].token_ids == ids1 and len(ids1) == 6 and first.choices[0].finish_reason == "length"
    assert streamed == decode(tok, ids2, True)
    assert first.usage.completion_tokens == 6
    assert first.choices[0].logprobs.content[0].logprob == pytest.approx(expected.response_logprobs[0], abs=1e-5)
    assert record.history_resets == 0 and len(record.turns) == 2
    assert out.prompt_ids == expected.prompt_ids == encode(tok, tok.apply_chat_template(
        USER, add_generation_prompt=True, tokenize=False))
    assert out.response_ids == expected.response_ids
    assert out.response_mask == expected.response_mask
    assert out.response_logprobs == pytest.approx(expected.response_logprobs, abs=1e-5)
    # by hand: turn 1 (6 sampled ids, no EOS) | the template's text for the follow-up (closing the cut turn) | turn 2
    delta = encode(tok, "<|im_end|>\n<|im_start|>user\nCheck it.<|im_end|>\n<|im_start|>assistant\n")
    assert out.response_ids == ids1 + delta + ids2
    assert out.response_mask == [1] * 6 + [0] * len(delta) + [1] * len(ids2)
    assert out.metrics["assistant_turns"] == 2.0


def test_completions_continue_token_exactly_and_bad_requests_are_named(vllm_engine):
    import openai

    engine, tok = vllm_engine

    async def body(server, client_for):
        tid = server.open()
        client = client_for(tid)
        a = await client.completions.create(model="m", prompt="What is 7 * 8?", max_tokens=5)
        more = "What is 7 * 8?" + a.choices[0].text + " So"
        b = await client.completions.create(model="m", prompt=more, max_tokens=5, logprobs=1)
        other = server.open()  # a prompt that does not continue the text so far starts the trajectory over
        await client_for(other).completions.create(model="m", prompt="Hi", max_tokens=2)
        await client_for(other).completions.create(model="m", prompt="What is", max_tokens=2)
        resets = server.close(other).history_resets
        errors = {}
        for name, make in {
            "no_id": lambda: client_for(None).completions.create(model="m", prompt="x", max_tokens=2),
            "unknown": lambda: client_for("nope").completions.create(model="m", prompt="x", max_tokens=2),
            "n2": lambda: client.completions.create(model="m", prompt="x", max_tokens=2, n=2),
            "mixed": lambda: client.chat.completions.create(model="m", messages=USER, max_tokens=2),
        }.items():
            with pytest.raises(openai.APIStatusError) as err:
                await make()
            errors[name] = (err.value.status_code, str(err.value))
        record = server.close(tid)
        with pytest.raises(openai.APIStatusError) as late:
            await client.completions.create(model="m", prompt=more, max_tokens=2)
        return a, b, errors, server.trajectory(record), late.value.status_code, resets

    a, b, errors, out, late, resets = serve(engine.generate, tok, body)
    assert resets == 1
    ids_a, ids_b = a.choices[0].token_ids, b.choices[0].token_ids
    assert out.prompt_ids == encode(tok, "What is 7 * 8?")
    assert out.response_ids == ids_a + encode(tok, " So") + ids_b  # the sampled ids, not a re-encoding of the text
    assert out.response_mask == [1] * len(ids_a) + [0] * len(encode(tok, " So")) + [1] * len(ids_b)
    assert b.choices[0].logprobs.token_logprobs == pytest.approx(out.response_logprobs[-len(ids_b):])
    assert errors["no_id"][0] == 400 and "trajectory id" in errors["no_id"][1]
    assert errors["unknown"][0] == 404 and "'nope'" in errors["unknown"][1]
    assert errors["n2"][0] == 400 and "n=2" in errors["n2"][1]
    assert errors["mixed"][0] == 400 and "one endpoint" in errors["mixed"][1]
    assert late == 410


def test_tool_calls_come_back_in_openai_shape_and_tool_results_are_masked(chat_tokenizer):
    from openai import AsyncOpenAI

    tok = chat_tokenizer
    engine = ScriptedEngine(tok, {"sum": [call("add", a=1, b=2), "#### 3"]})
    tools = [schema("add")]

    async def main():
        server = OpenAIServer(engine, tok, {}, 200)
        await server.start()
        try:
            tid = server.open()
            client = AsyncOpenAI(base_url=server.base_url(), api_key="x", max_retries=0)
            msgs = [{"role": "user", "content": "sum 1 and 2"}]
            first = await client.chat.completions.create(model="m", messages=msgs, tools=tools, user=tid)
            tool_call = first.choices[0].message.tool_calls[0]
            msgs += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": tool_call.id, "content": "3"}]
            second = await client.chat.completions.create(model="m", messages=msgs, tools=tools,
                                                          extra_headers={"X-Trajectory-Id": tid})
            return first, tool_call, second, server.trajectory(server.close(tid))
        finally:
            await server.aclose()

    first, tool_call, second, out = asyncio.run(main())
    assert first.choices[0].finish_reason == "tool_calls"
    assert tool_call.function.name == "add" and tool_call.function.arguments == '{"a": 1, "b": 2}'
    assert second.choices[0].message.content == "#### 3" and second.choices[0].finish_reason == "stop"
    turn1 = encode(tok, call("add", a=1, b=2)) + [tok.eos_token_id]
    delta = encode(tok, "\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    turn2 = encode(tok, "#### 3") + [tok.eos_token_id]
    assert out.response_ids == turn1 + delta + turn2
    assert out.response_mask == [1] * len(turn1) + [0] * len(delta) + [1] * len(turn2)
