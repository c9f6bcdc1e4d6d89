"""Synthetic calculator task for multi-turn rollouts with a tool: products a tiny model cannot compute alone.

"What is 347 * 29? Use the calculator, then answer with #### followed by the number." -> a calculator call,
its result, then "#### 10063". Scored by `rlpost.reward.score.arith` (exact integer, data_source rlpost/arith).

Writes into --local_dir:
  train.parquet, test.parquet   RL rows in verl's format with `agent_name: tool_agent` (or --agent_name); with
                                --interaction NAME also `extra_info.interaction_kwargs` ({name, query,
                                ground_truth}) for that interaction (e.g. the built-in gsm8k one, which checks
                                the `####` answer)
  sft_train.parquet             SFT transcripts from a teacher that uses the calculator on a fraction
                                --tool_rate of the questions (and otherwise guesses a nearby number): per
                                question a row `prompt` [user] -> `response` the call, and a row
                                [user, call, tool result] -> "#### <result>"; column `tools` holds the tool
                                schemas as JSON (sft_trainer's data.tools_key=tools renders them as in RL)
  corpus.txt                    the same text, for training a tiny tokenizer that knows it
                                (scripts/make_tiny_model.py --corpus_file)

    python examples/data_preprocess/calculator.py --local_dir ~/data/calculator \\
        --tools_config examples/multiturn/config/tool_config/calculator_tool_config.yaml
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

DATA_SOURCE = "rlpost/arith"
INSTRUCTION = "Use the calculator, then answer with #### followed by the number."
AGENT = "tool_agent"


def question(a: int, b: int) -> str:
    return f"What is {a} * {b}? {INSTRUCTION}"


def tool_call(a: int, b: int) -> str:
    """The hermes-format call the model should write (parsed by rlpost.agent.tool_parser)."""
    call = {"name": "calculator", "arguments": {"expression": f"{a} * {b}"}}
    return "<tool_call>" + json.dumps(call) + "</tool_call>"


def sample_pairs(n: int, num_digits: int, rng: random.Random, exclude: set, b_digits: int = 2,
                 full_width: bool = False) -> list[tuple[int, int]]:
    """`n` distinct (a, b) with a of `num_digits` digits and b of `b_digits`, none in `exclude`.

    With `full_width`, only pairs whose product has `num_digits + b_digits` digits: every answer then has the
    same length, so copying the tool's result is the same shift for every question.
    """
    low, high = 10 ** (num_digits - 1), 10**num_digits - 1
    width = num_digits + b_digits
    out, seen = [], set(exclude)
    while len(out) < n:
        pair = (rng.randint(low, high), rng.randint(10 ** (b_digits - 1), 10**b_digits - 1))
        if full_width and len(str(pair[0] * pair[1])) != width:
            continue
        if pair not in seen:
            seen.add(pair)
            out.append(pair)
    return out


def rl_rows(pairs: list[tuple[int, int]], split: str, interaction: str | None, agent: str = AGENT) -> list[dict]:
    rows = []
    for i, (a, b) in enumerate(pairs):
        extra = {"split": split, "index": i}
        if interaction:
            extra["interaction_kwargs"] = {"name": interaction, "query": question(a, b), "ground_truth": str(a * b)}
        rows.append({"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": question(a, b)}],
                     "ability": "math", "agent_name": agent,
                     "reward_model": {"style": "rule", "ground_truth": str(a * b)}, "extra_info": extra})
    return rows


def sft_rows(pairs: list[tuple[int, int]], tools_json: str, tool_rate: float, rng: random.Random,
             copy_all: bool = False) -> list[dict]:
    """The teacher's rows (module docstring); `copy_all` adds the answer-after-the-call row to guessed questions."""
    rows = []
    for a, b in pairs:
        user = {"role": "user", "content": question(a, b)}
        call = tool_call(a, b)
        if rng.random() >= tool_rate:  # the teacher guesses: a number near the product
            guess = a * b + rng.choice([-1, 1]) * rng.randint(1, 99)
            rows.append({"prompt": [user], "response": f"#### {guess}", "tools": tools_json})
            if not copy_all:
                continue
        else:
            rows.append({"prompt": [user], "response": call, "tools": tools_json})
        conversation = [user, {"role": "assistant", "content": call}, {"role": "tool", "content": str(a * b)}]
        rows.append({"prompt": conversation, "response": f"#### {a * b}", "tools": tools_json})
    return rows


# Hermes / Qwen2.5 markup that chat templates wrap around tools, calls and tool results.
MARKUP = "# Tools\n<tools>\n</tools>\n<tool_call>\n</tool_call>\n<tool_response>\n</tool_response>"


def corpus(rows: list[dict], tools_json: str) -> list[str]:
    """Text lines of the transcripts, the schemas and the tool markup, for the tokenizer."""
    lines = [json.dumps(s) for s in json.loads(tools_json)]
    for row in rows:
        lines += [m["content"] for m in row["prompt"]] + [row["response"], MARKUP]
    return lines


def generate(local_dir: str, tools_config: str, train_size: int = 512, test_size: int = 32, num_digits: int = 3,
             tool_rate: float = 1.0, interaction: str | None = None, seed: int = 0, b_digits: int = 2,
             full_width: bool = False, copy_all: bool = False, agent_name: str = AGENT) -> dict[str, Path]:
    """Write the files of the module docstring; return their paths by name."""
    import pandas as pd

    from rlpost.tools.utils.tool_registry import tools_by_name

    if not 0.0 <= tool_rate <= 1.0:
        raise ValueError(f"--tool_rate must be in [0, 1], got {tool_rate}")
    tools = tools_by_name(tools_config)
    if "calculator" not in tools:
        raise ValueError(f"--tools_config {tools_config} has no tool named 'calculator' (tools: {sorted(tools)})")
    tools_json = json.dumps([t.tool_schema.model_dump() for t in tools.values()])
    rng = random.Random(seed)
    test = sample_pairs(test_size, num_digits, rng, set(), b_digits, full_width)
    train = sample_pairs(train_size, num_digits, rng, set(test), b_digits, full_width)
    out = Path(local_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / f"{name}.parquet" for name in ("train", "test", "sft_train")}
    paths["corpus"] = out / "corpus.txt"
    pd.DataFrame(rl_rows(train, "train", interaction, agent_name)).to_parquet(paths["train"])
    pd.DataFrame(rl_rows(test, "test", interaction, agent_name)).to_parquet(paths["test"])
    sft = sft_rows(train, tools_json, tool_rate, rng, copy_all)
    pd.DataFrame(sft).to_parquet(paths["sft_train"])
    paths["corpus"].write_text("\n".join(corpus(sft, tools_json)) + "\n")
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local_dir", required=True)
    p.add_argument("--tools_config", required=True, help="tools YAML with the calculator")
    p.add_argument("--train_size", type=int, default=512)
    p.add_argument("--test_size", type=int, default=32)
    p.add_argument("--num_digits", type=int, default=3, help="digits of the first factor")
    p.add_argument("--b_digits", type=int, default=2, help="digits of the second factor")
    p.add_argument("--full_width", action="store_true",
                   help="only products of num_digits + b_digits digits (answers of one length)")
    p.add_argument("--tool_rate", type=float, default=1.0, help="fraction of SFT transcripts that use the tool")
    p.add_argument("--copy_all", action="store_true",
                   help="answer-after-the-call rows for every question, not only those the teacher called on")
    p.add_argument("--interaction", default=None, help="interaction name to put in extra_info.interaction_kwargs")
    p.add_argument("--agent_name", default=AGENT, help="agent loop of the RL rows (e.g. calculator_agent: "
                   "examples/multiturn/calculator_agent_loop.py)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    paths = generate(a.local_dir, a.tools_config, a.train_size, a.test_size, a.num_digits, a.tool_rate,
                     a.interaction, a.seed, a.b_digits, a.full_width,
                     a.copy_all, a.agent_name)
    for name, path in paths.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
