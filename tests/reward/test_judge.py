"""The generative judge's request, verdict parsing and scoring (`rlpost.reward.judge`), against hand-derived values;
requests go through the real `openai` client to a real aiohttp server on localhost that answers by a fixed rule
(an OpenAI-compatible endpoint whose verdicts are known in advance)."""

import asyncio
import re
import threading
import time
from types import SimpleNamespace

import pytest

from rlpost.reward import base
from rlpost.reward.judge import (JudgeEndpoint, chat_complete, judge_metrics, judge_request, render_prompt,
                                 run_reward_loop, score_with_judge, verdict_score)

pytestmark = pytest.mark.timeout(120)


def _cfg(**over):
    """A judge config as the YAML's defaults have it, with `over` applied."""
    cfg = dict(enable=True, url=None, model_name="judge", api="chat", max_concurrency=4, timeout_s=30.0,
               prompt_template="Q={prompt} A={response} T={ground_truth}", system_prompt=None, parser="last_number",
               pattern=r"(?i)score\s*[:=]\s*(-?\d+(?:\.\d+)?)", json_key="score", max_score=10.0, failure_score=0.0,
               max_tokens=8, temperature=0.0, top_p=1.0)
    return SimpleNamespace(**{**cfg, **over})


@pytest.mark.parametrize("parser, text, number", [
    ("last_number", "7/10 at first, then 8", 8.0),
    ("last_number", "-3.5 and finally 2.25", 2.25),
    ("last_number", "no verdict here", None),
    ("regex", "three steps, 4 checks. SCORE: 9", 9.0),
    ("regex", "Score = -1.5", -1.5),
    ("regex", "score - 9", None),
    ("json", 'first {"a": 1} then {"score": 7, "why": "ok"}', 7.0),
    ("json", '{"score": "high"}', None),
    ("json", '{"score": 3', None),
])
def test_parsers_read_the_number_a_reader_would(parser, text, number):
    cfg = _cfg(parser=parser, max_score=None, failure_score=-1.0)
    assert verdict_score(text, cfg) == ((number, True) if number is not None else (-1.0, False))


@pytest.mark.parametrize("text, score", [("8", 0.8), ("15", 1.0), ("-2", 0.0), ("2.5", 0.25), ("none", 0.5)])
def test_max_score_scales_and_clamps_failures_keep_their_score(text, score):
    assert verdict_score(text, _cfg(failure_score=0.5))[0] == pytest.approx(score)


def test_template_replaces_the_three_fields_and_keeps_other_braces():
    template = 'P:{prompt}|R:{response}|G:{ground_truth}|reply as {"score": n} {other}'
    assert render_prompt(template, "1+1?", "2", 2) == 'P:1+1?|R:2|G:2|reply as {"score": n} {other}'
    assert render_prompt("{ground_truth}!", "", "", None) == "!"


def _sample(i, response, truth="4", prompt="2+2?"):
    return base.Sample(index=i, data_source="d", prompt_str=prompt, response_str=response, ground_truth=truth,
                       extra_info=None, valid_response_length=1)


def test_requests_for_chat_and_completions():
    s = _sample(0, "4")
    chat = judge_request(_cfg(system_prompt="be strict"), s, "m")
    assert chat == {"model": "m", "max_tokens": 8, "temperature": 0.0, "top_p": 1.0,
                    "messages": [{"role": "system", "content": "be strict"},
                                 {"role": "user", "content": "Q=2+2? A=4 T=4"}]}
    plain = judge_request(_cfg(api="completions"), s, "m")
    assert plain["prompt"] == "Q=2+2? A=4 T=4" and "messages" not in plain


class RuleJudge:
    """An OpenAI-compatible server (aiohttp, a thread of its own) whose verdict follows the request: "right" in the
    answer -> "score: 8", "wrong" -> "I give it 2", otherwise "no idea". Counts the requests in flight at once."""

    def __init__(self, delay_s: float = 0.05):
        from aiohttp import web

        self.delay_s, self.in_flight, self.peak, self.bodies = delay_s, 0, 0, []
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve():
            asyncio.set_event_loop(self.loop)
            app = web.Application()
            app.add_routes([web.post("/v1/chat/completions", self._chat), web.post("/v1/completions", self._chat)])
            runner = web.AppRunner(app)
            self.loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            started.set()
            self.loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        assert started.wait(10)
        self.address = f"127.0.0.1:{self.port}"

    async def _chat(self, request):
        from aiohttp import web

        body = await request.json()
        self.bodies.append(body)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        text = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
        answer = re.search(r"A=(.*?) T=", text).group(1)
        verdict = "score: 8" if "right" in answer else "I give it 2" if "wrong" in answer else "no idea"
        choice = ({"index": 0, "message": {"role": "assistant", "content": verdict}, "finish_reason": "stop"}
                  if "messages" in body else {"index": 0, "text": verdict, "finish_reason": "stop"})
        return web.json_response({"id": "x", "object": "chat.completion", "created": int(time.time()),
                                  "model": body["model"], "choices": [choice]})

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def rule_judge():
    server = RuleJudge()
    yield server
    server.close()


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_scores_in_order_failures_counted_concurrency_bounded(rule_judge, api):
    answers = ["right", "wrong", "hmm", "right", "wrong", "right", "?", "right", "wrong", "right", "x", "right"]
    cfg = _cfg(api=api, max_concurrency=3, failure_score=-1.0)
    out = score_with_judge(cfg, _endpoint(rule_judge), [_sample(i, a) for i, a in enumerate(answers)])
    want = {"right": 0.8, "wrong": 0.2}
    assert [r["score"] for r in out] == pytest.approx([want.get(a, -1.0) for a in answers])
    assert [r["judge_parse_failed"] for r in out] == [int(a not in want) for a in answers]
    assert rule_judge.peak == 3  # 12 requests, at most 3 in flight, and the 3 were used
    assert {b["model"] for b in rule_judge.bodies} == {"judge"}
    metrics = judge_metrics({k: [r[k] for r in out] for k in ("judge_parse_failed", "judge_latency_s")})
    assert metrics["reward/judge/parse_failure_count"] == 3.0 and metrics["reward/judge/requests"] == 12.0
    assert rule_judge.delay_s <= metrics["reward/judge/latency_s_max"] < 10


def _endpoint(server):
    endpoint = JudgeEndpoint(None, "judge")
    endpoint.set_addresses([server.address])
    return endpoint


def test_metrics_by_hand():
    m = judge_metrics({"judge_parse_failed": [1, 0, 0], "judge_latency_s": [0.1, 0.2, 0.3]})
    assert m == pytest.approx({"reward/judge/parse_failure_count": 1.0, "reward/judge/requests": 3.0,
                               "reward/judge/latency_s_mean": 0.2, "reward/judge/latency_s_max": 0.3})
    assert judge_metrics({}) == {}


def test_unreachable_judge_names_the_sample():
    endpoint = JudgeEndpoint("http://127.0.0.1:9/v1", "judge")  # the discard port: nothing listens
    with pytest.raises(base.RewardFunctionError, match=r"data_source='d', sample 0: the judge request failed"):
        score_with_judge(_cfg(timeout_s=5.0), endpoint, [_sample(0, "right")])


async def verl_style_genrm(data_source, solution_str, ground_truth, extra_info, reward_router_address,
                           reward_model_tokenizer):
    """A custom reward function written as verl's reward-loop docs show one: it asks the judge itself."""
    request = {"model": "judge", "messages": [{"role": "user", "content": f"Q=? A={solution_str} T={ground_truth}"}]}
    reply = await chat_complete(reward_router_address, request)
    text = reply.choices[0].message.content
    return {"score": float(text.split()[-1]) if text.startswith("score") else 0.0, "tok": reward_model_tokenizer}


def rule_only(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)


def test_reward_loop_calls_async_functions_with_the_router_address_and_plain_ones_as_they_are(rule_judge):
    samples = [_sample(i, a) for i, a in enumerate(["right", "wrong", "4", "right"])]
    out = run_reward_loop(verl_style_genrm, samples, _endpoint(rule_judge), "TOKENIZER", max_concurrency=2)
    assert [r["score"] for r in out] == [8.0, 0.0, 0.0, 8.0] and {r["tok"] for r in out} == {"TOKENIZER"}
    assert rule_judge.peak <= 2
    assert run_reward_loop(rule_only, samples, _endpoint(rule_judge), None, max_concurrency=2) == [0.0, 0.0, 1.0, 0.0]


def test_judge_manager_puts_each_verdict_on_the_last_response_token(rule_judge, make_batch, tokenizer):
    from rlpost.reward.custom import RewardFnSpec
    from rlpost.reward.judge_manager import JudgeRewardManager

    batch = make_batch(["right answer", "wrong", "dunno"], ["3", "3", "3"])
    manager = JudgeRewardManager(tokenizer, 0, RewardFnSpec(), _cfg(), _endpoint(rule_judge))
    result = manager(batch, return_dict=True)
    scores = result["reward_tensor"]
    lengths = batch.batch["response_mask"].sum(-1).tolist()
    assert scores.sum(-1).tolist() == pytest.approx([0.8, 0.2, 0.0])
    assert [float(scores[i, n - 1]) for i, n in enumerate(lengths)] == pytest.approx([0.8, 0.2, 0.0])
    assert result["reward_extra_info"]["judge_parse_failed"] == [0, 0, 1]
    assert "T=3" in rule_judge.bodies[0]["messages"][-1]["content"]  # the row's ground truth reached the judge
