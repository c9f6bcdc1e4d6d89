"""Data preparation scripts: the synthetic arithmetic task and the GSM8K converter (local fixture)."""

import importlib.util
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from rlpost.reward import default_compute_score

ROOT = Path(__file__).resolve().parents[2]


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"preprocess_{name}", ROOT / "examples/data_preprocess" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_arith_generator(tmp_path):
    arith = load_script("arith")
    arith.main(["--local_dir", str(tmp_path), "--train_size", "50", "--test_size", "20", "--seed", "3"])
    train, test = pd.read_parquet(tmp_path / "train.parquet"), pd.read_parquet(tmp_path / "test.parquet")
    assert len(train) == 50 and len(test) == 20
    assert set(train.columns) >= {"data_source", "prompt", "reward_model", "extra_info"}
    row = train.iloc[0]
    a, _, b = row["prompt"][0]["content"].split("?")[0].split()[-3:]
    assert row["prompt"][0]["role"] == "user"
    assert row["reward_model"]["ground_truth"] == str(int(a) + int(b))
    assert default_compute_score(row["data_source"], row["extra_info"]["answer"], row["reward_model"]["ground_truth"]) == 1.0
    questions = lambda df: {p[0]["content"] for p in df["prompt"]}  # noqa: E731
    assert not questions(train) & questions(test)  # held-out problems are unseen
    assert len(questions(train)) == 50
    sft = pd.read_parquet(tmp_path / "sft_train.parquet")
    assert sft["question"].tolist() == sft["prompt"].tolist() == [p[0]["content"] for p in train["prompt"]]
    assert sft["answer"].iloc[0] == f"#### {row['reward_model']['ground_truth']}"
    # same seed -> same data
    arith.main(["--local_dir", str(tmp_path / "again"), "--train_size", "50", "--test_size", "20", "--seed", "3"])
    assert pd.read_parquet(tmp_path / "again/train.parquet").equals(train)


def test_arith_prompt_is_short(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    arith = load_script("arith")
    assert len(tok(arith.question(87, "+", 45), add_special_tokens=False)["input_ids"]) <= 18
    assert len(tok("#### 132", add_special_tokens=False)["input_ids"]) <= 8


def test_arith_rejects_impossible_sizes(tmp_path):
    arith = load_script("arith")
    with pytest.raises(ValueError, match="only 16 exist"):
        arith.generate(str(tmp_path), train_size=20, test_size=0, max_operand=3)
    with pytest.raises(ValueError, match="--ops"):
        arith.generate(str(tmp_path), ops="/")


def write_gsm8k_fixture(root: Path, as_jsonl: bool):
    train = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
             {"question": "A farm sells 1,000 eggs twice.", "answer": "1000*2=2000\n#### 2,000"}]
    test = [{"question": "What is 5 - 2?", "answer": "5-2=3\n#### 3"}]
    (root / "main").mkdir(parents=True)
    for split, rows in (("train", train), ("test", test)):
        if as_jsonl:
            (root / "main" / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
        else:
            pd.DataFrame(rows).to_parquet(root / "main" / f"{split}-00000-of-00001.parquet")


@pytest.mark.parametrize("as_jsonl", [False, True])
def test_gsm8k_conversion(tmp_path, as_jsonl):
    gsm8k = load_script("gsm8k")
    write_gsm8k_fixture(tmp_path / "raw", as_jsonl)
    gsm8k.main(["--local_dir", str(tmp_path / "raw"), "--output_dir", str(tmp_path / "out")])
    train = pd.read_parquet(tmp_path / "out/train.parquet")
    test = pd.read_parquet(tmp_path / "out/test.parquet")
    assert len(train) == 2 and len(test) == 1
    assert train["data_source"].tolist() == ["openai/gsm8k"] * 2
    assert [r["ground_truth"] for r in train["reward_model"]] == ["7", "2000"]
    content = train["prompt"][0][0]["content"]
    assert content.startswith("Tom has 3 apples") and content.endswith(gsm8k.INSTRUCTION)
    assert train["extra_info"][1]["index"] == 1 and train["extra_info"][1]["split"] == "train"
    assert default_compute_score("openai/gsm8k", train["extra_info"][0]["answer"], "7") == 1.0


def test_gsm8k_missing_files_and_bad_answer(tmp_path):
    gsm8k = load_script("gsm8k")
    with pytest.raises(FileNotFoundError, match="no GSM8K train files under"):
        gsm8k.convert(str(tmp_path))
    with pytest.raises(ValueError, match="without '#### <number>'"):
        gsm8k.extract_answer("no final answer")


@pytest.mark.timeout(30)
def test_code_ops_holds_out_operator_k_pairs(tmp_path):
    """The TASK=code split (the quickstart's settings): 16 held-out (operator, K) pairs, two per one-digit K, never
    in training, each held-out K there with its other two operators; hidden outputs are N <op> K; the teacher's
    programs use the wrong operator ~70% of the time."""
    code_synth = load_script("code_synth")
    paths = code_synth.generate_ops(str(tmp_path), train_size=3000, test_size=16, seed=0, n_cases=3, sft_slip=0.7,
                                    k_max=9)
    train, test, sft = (pd.read_parquet(paths[k]) for k in ("train", "test", "sft_train"))
    pairs = lambda frame: [(e["op"], int(e["k"])) for e in frame["extra_info"]]  # noqa: E731
    held_out = set(pairs(test))
    assert len(held_out) == 16 and not held_out & set(pairs(train))
    assert sorted(w for w, _ in held_out) == sorted(["minus", "modulo", "plus", "times"] * 4)
    words = {"minus", "modulo", "plus", "times"}
    for k in range(2, 10):
        assert {w for w, kk in pairs(train) if kk == k} == words - {w for w, kk in held_out if kk == k}
        assert len([1 for _, kk in held_out if kk == k]) == 2
    ops = {"plus": lambda n, k: n + k, "minus": lambda n, k: n - k, "times": lambda n, k: n * k,
           "modulo": lambda n, k: n % k}
    for (word, k), truth in zip(pairs(test), test["reward_model"]):
        cases = json.loads(truth["ground_truth"])
        assert cases["outputs"] == [f"{ops[word](int(i), k)}\n" for i in cases["inputs"]]
    wrong = [f"print(n {code_synth.OPS[w]} {k})" not in r for (w, k), r in zip(pairs(train), sft["response"])]
    assert 0.65 < sum(wrong) / len(wrong) < 0.75
    with pytest.raises(ValueError, match="test_size"):
        code_synth.generate_ops(str(tmp_path), train_size=10, test_size=25, seed=0, n_cases=3, sft_slip=0.7, k_max=9)
    with pytest.raises(ValueError, match="k_max"):
        code_synth.generate_ops(str(tmp_path), train_size=10, test_size=1, seed=0, n_cases=3, sft_slip=0.7, k_max=1)


def test_times_ten_task_and_imperfect_teacher(tmp_path):
    times_ten = load_script("times_ten")
    paths = times_ten.generate(str(tmp_path), train_size=400, test_size=50, num_digits=3, sft_slip=0.7, seed=0)
    train, test, sft = (pd.read_parquet(paths[k]) for k in ("train", "test", "sft_train"))
    numbers = [e["number"] for e in train["extra_info"]]
    assert not set(numbers) & {e["number"] for e in test["extra_info"]}
    row = train.iloc[0]
    assert row["prompt"][0]["content"].startswith(f"What is {numbers[0]} * 10?")
    assert row["reward_model"]["ground_truth"] == numbers[0] + "0"
    slipped = [a == f"#### {n}" for a, n in zip(sft["answer"], numbers)]
    correct = [a == f"#### {n}0" for a, n in zip(sft["answer"], numbers)]
    assert all(s or c for s, c in zip(slipped, correct))
    assert 0.6 < sum(slipped) / len(slipped) < 0.8
    with pytest.raises(ValueError, match="sft_slip"):
        times_ten.generate(str(tmp_path), sft_slip=1.5)


CALCULATOR_TOOLS = ROOT / "examples/multiturn/config/tool_config/calculator_tool_config.yaml"


@pytest.mark.timeout(60)
def test_calculator_full_width_pairs_and_teacher_rows(tmp_path):
    """The quickstart's calculator task: 4 x 4 digits, 8-digit products, the teacher calls the tool on a share of
    the questions and shows the copy of the tool's result on all of them (--copy_all)."""
    calc = load_script("calculator")
    paths = calc.generate(str(tmp_path), str(CALCULATOR_TOOLS), train_size=400, test_size=20, num_digits=4,
                          b_digits=4, full_width=True, tool_rate=0.3, copy_all=True, seed=0)
    train, test = pd.read_parquet(paths["train"]), pd.read_parquet(paths["test"])
    truths = [r["ground_truth"] for r in train["reward_model"]] + [r["ground_truth"] for r in test["reward_model"]]
    assert {len(t) for t in truths} == {8}
    assert not {p[0]["content"] for p in train["prompt"]} & {p[0]["content"] for p in test["prompt"]}
    assert set(train["agent_name"]) == {"tool_agent"}
    sft = pd.read_parquet(paths["sft_train"])
    first = sft[[len(p) == 1 for p in sft["prompt"]]]
    after_call = sft[[len(p) == 3 for p in sft["prompt"]]]
    assert len(first) == len(after_call) == 400  # one first turn and one answer-after-the-call per question
    calls = first["response"].str.startswith("<tool_call>")
    assert 0.2 < calls.mean() < 0.4
    for _, row in first[~calls].iterrows():  # a guess: a number, never the product
        a, b = (int(x) for x in row["prompt"][0]["content"].split("?")[0].split()[-3::2])
        assert row["response"].startswith("#### ") and int(row["response"][5:]) != a * b
    for _, row in after_call.iterrows():  # the answer copies the tool's result
        assert row["prompt"][2]["role"] == "tool" and row["response"] == f"#### {row['prompt'][2]['content']}"


@pytest.mark.timeout(60)
def test_calculator_without_copy_all_answers_only_after_its_own_calls(tmp_path):
    calc = load_script("calculator")
    paths = calc.generate(str(tmp_path), str(CALCULATOR_TOOLS), train_size=200, test_size=4, tool_rate=0.5, seed=1)
    sft = pd.read_parquet(paths["sft_train"])
    calls = sum(r.startswith("<tool_call>") for r in sft["response"])
    assert sum(len(p) == 3 for p in sft["prompt"]) == calls
    assert len(sft) == 200 + calls
