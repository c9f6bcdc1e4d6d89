"""Code scorers against the real sandbox service: stdin/stdout, call-based and assert-based cases, partial credit,
C++, the dispatch by data_source, and the built-in scorer's sandbox arguments from the config."""

import json

import pytest

from rlpost.reward.score import default_compute_score
from rlpost.reward.score.code import (compute_score, extract_code, format_slowest, parse_tests, same_output, same_value,
                                      sandbox_metrics, slowest_samples, problem_with_tests)

STDIO = json.dumps({"inputs": ["1 2\n", "10 5\n", "-3 3\n", "7 0\n"], "outputs": ["3\n", "15\n", "0\n", "7\n"]})


def fenced(code: str, lang: str = "python") -> str:
    return f"Here is my answer.\n```{lang}\n{code}\n```\nDone."


def test_parsing_helpers():
    assert extract_code("no code") == (None, "python")
    assert extract_code("```python\na\n```\ntext\n```cpp\nb\n```") == ("b\n", "cpp")  # the last block
    assert extract_code("```python\na\n```\nthen ```python\nprint(2)\nx =") == ("print(2)\nx =", "python")  # cut off
    assert parse_tests("not json") is None and parse_tests({"inputs": ["1"], "outputs": []}) is None
    assert parse_tests({"assert_case": ["assert f(1) == 2"]})["inputs"] == [""]
    assert same_output("3  \n\n", "3\n") and same_output("1 2\n3", "1\n2 3") and not same_output("4\n", "3\n")
    assert same_value("[1, 2]", [[1, 2]]) and same_value("5", 5) and not same_value("5", 6)


def test_stdin_stdout_full_and_partial_credit(sandbox):
    right = compute_score(sandbox.url, fenced("a, b = map(int, input().split())\nprint(a + b)"), STDIO)
    assert (right["score"], right["sandbox_status"]) == (1.0, "passed")
    # right only when b is 0 or negative: cases 3 and 4 of 4 pass -> 0.5 (continuous), 0.0 (all-or-nothing)
    half = "a, b = map(int, input().split())\nprint(a + b if b <= 0 or a < 0 else a * b)"
    assert compute_score(sandbox.url, fenced(half), STDIO)["score"] == 0.5
    assert compute_score(sandbox.url, fenced(half), STDIO, continuous=False)["score"] == 0.0
    assert compute_score(sandbox.url, "print(1)", STDIO)["sandbox_status"] == "no_code"
    assert compute_score(sandbox.url, fenced("print(1)"), "{}")["sandbox_status"] == "bad_tests"


def test_only_the_first_max_cases_count(sandbox):
    tests = json.dumps({"inputs": [f"{i}\n" for i in range(12)], "outputs": [f"{i}\n" for i in range(10)] + ["x", "y"]})
    assert compute_score(sandbox.url, fenced("print(input())"), tests)["score"] == 1.0  # cases 11, 12 not run
    assert compute_score(sandbox.url, fenced("print(input())"), tests, max_cases=12)["score"] == pytest.approx(10 / 12)


def test_call_based_function_and_solution_method(sandbox):
    tests = {"fn_name": "add", "inputs": ["1\n2", "[1]\n[2, 3]"], "outputs": [[3], [[1, 2, 3]]]}
    assert compute_score(sandbox.url, fenced("def add(a, b):\n    return a + b"), tests)["score"] == 1.0
    method = "class Solution:\n    def add(self, a, b):\n        return a + b if isinstance(a, int) else a"
    assert compute_score(sandbox.url, fenced(method), tests)["score"] == 0.5


def test_assert_cases(sandbox):
    tests = {"assert_case": ["assert sq(3) == 9", "assert sq(-2) == 4", "assert sq(0) == 1"]}
    result = compute_score(sandbox.url, fenced("def sq(x):\n    return x * x"), tests)
    assert result["score"] == pytest.approx(2 / 3) and result["sandbox_status"] == "runtime_error"


def test_cpp_and_its_compile_error(sandbox):
    cpp = "#include <iostream>\nint main(){long a,b; std::cin>>a>>b; std::cout<<a+b<<std::endl;}"
    assert compute_score(sandbox.url, fenced(cpp, "cpp"), STDIO)["score"] == 1.0
    broken = compute_score(sandbox.url, fenced("int main(){ return x; }", "cpp"), STDIO)
    assert (broken["score"], broken["sandbox_status"]) == (0.0, "compile_error")


def test_default_compute_score_dispatches_code_sources(sandbox):
    code = fenced("a, b = map(int, input().split())\nprint(a + b)")
    for source in ("codecontests", "apps", "taco", "codeforces", "prime_code"):
        assert default_compute_score(source, code, STDIO, sandbox_fusion_url=sandbox.url)["score"] == 1.0
    with pytest.raises(ValueError, match="data_source='apps' is scored by running the program: set "
                                         "reward_model.sandbox_fusion.url"):
        default_compute_score("apps", code, STDIO)
    with pytest.raises(TypeError, match="apply to code data sources only"):
        default_compute_score("openai/gsm8k", "#### 1", "1", timeout=3)


def test_verl_import_path_gives_verls_tuple(sandbox):
    from rlpost.utils.reward_score import sandbox_fusion

    score, details = sandbox_fusion.compute_score(sandbox.url, None, 512, fenced("print(input())"),
                                                  json.dumps({"inputs": ["a\n"], "outputs": ["b\n"]}))
    assert score == 0.0 and details[0]["sandbox_status"] == "wrong_answer"


def test_sandbox_metrics_from_the_batch_extras():
    extra = {"sandbox_status": ["passed", "memory", None, "wall_time"], "sandbox_pass_rate": [1.0, 0.0, None, 0.5],
             "sandbox_seconds": [0.1, 0.2, None, 2.0]}
    metrics = sandbox_metrics(extra)
    assert metrics["reward/sandbox/pass_rate"] == pytest.approx(0.5)  # (1 + 0 + 0.5) / 3 code rows
    assert metrics["reward/sandbox/solved"] == pytest.approx(1 / 3)
    assert (metrics["reward/sandbox/memory_count"], metrics["reward/sandbox/wall_time_count"],
            metrics["reward/sandbox/compile_error_count"], metrics["reward/sandbox/max_seconds"]) == (1, 1, 0, 2.0)
    assert sandbox_metrics({"score": [1.0]}) == {}


def test_problem_with_tests_names_what_is_wrong():
    assert problem_with_tests({"inputs": ["1\n"], "outputs": ["1\n"]}) is None
    assert problem_with_tests('{"inputs": ["[1]"], "outputs": [2], "fn_name": "f"}') is None
    assert problem_with_tests({"assert_case": ["assert f(1) == 2"]}) is None
    assert problem_with_tests('{"inputs": [1') .startswith("is not valid JSON (")
    assert problem_with_tests("[1, 2]") == ("is a JSON list, not an object with 'inputs' and 'outputs' (or "
                                       "'assert_case')")
    assert problem_with_tests({"input": ["1"], "outputs": ["1"]}) == "has no 'inputs' (keys: ['input', 'outputs'])"
    assert problem_with_tests({"inputs": "1", "outputs": ["1"]}) == "has 'inputs' of type str, not a list"
    assert problem_with_tests({"inputs": [], "outputs": []}) == "has empty 'inputs' (no test case)"
    assert problem_with_tests({"inputs": ["1", "2"], "outputs": ["1"]}) == "has 2 'inputs' but 1 'outputs'"
    assert problem_with_tests({"inputs": ["1"], "outputs": ["1"], "fn_name": 3}) == "has 'fn_name' of type int, not a string"
    assert problem_with_tests({"assert_case": []}).startswith("has 'assert_case' that is not a non-empty list")
    assert parse_tests({"assert_case": [1]}) is None  # what the scorer rejects is what start-up refuses


def test_slowest_samples_by_name_in_the_metrics_and_the_log_line():
    extra = {"sandbox_status": ["passed", None, "wall_time", "wrong_answer", "passed"],
             "sandbox_seconds": [0.5, None, 3.0, 0.25, 1.5], "sandbox_pass_rate": [1.0, None, 0.0, 0.5, 1.0],
             "data_source": ["apps", "openai/gsm8k", "taco", "apps", "apps"], "index": [7, 8, 9, 10, 11]}
    slowest = slowest_samples(extra, top=3)
    assert slowest == [("taco row 9", 3.0, "wall_time"), ("apps row 11", 1.5, "passed"), ("apps row 7", 0.5, "passed")]
    assert format_slowest(slowest[:2]) == "taco row 9: 3.00 s (wall_time), apps row 11: 1.50 s (passed)"
    metrics = sandbox_metrics(extra)
    assert [metrics[f"reward/sandbox/slowest_{k}_seconds"] for k in (1, 2, 3)] == [3.0, 1.5, 0.5]
    del extra["index"]  # without the data file's row index the batch row names the sample
    assert slowest_samples(extra, top=1) == [("taco batch row 2", 3.0, "wall_time")]
    assert slowest_samples({"score": [1.0]}) == []


def test_bad_test_cases_stop_start_up_naming_file_and_row():
    from rlpost.reward.preflight import check_code_tests

    class Rows:  # what RLHFDataset exposes: every row and the rows of each file
        rows = [{"data_source": "apps", "reward_model": {"ground_truth": STDIO}},
                {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "7"}},  # not code: not read
                {"data_source": "apps", "reward_model": {"ground_truth": '{"inputs": ["1"], "outputs": []}'}},
                {"data_source": "taco", "reward_model": {"ground_truth": "not json"}}]
        file_rows = [("a.parquet", 2), ("b.parquet", 2)]

    with pytest.raises(ValueError) as err:
        check_code_tests(Rows(), "data.train_files")
    message = str(err.value)
    assert message.startswith("data.train_files: b.parquet row 0 (data_source='apps'): reward_model.ground_truth "
                              "has 1 'inputs' but 0 'outputs' (2 of 4 rows have unusable test cases)"), message
    assert '{"inputs": ["1 2\\n"], "outputs": ["3\\n"]}' in message
    Rows.rows = Rows.rows[:2]
    assert check_code_tests(Rows(), "data.train_files") is None  # every code row usable


def compose(*overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from rlpost.trainer.config import CONFIG_DIR

    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        return hydra_compose("ppo_trainer", overrides=list(overrides))


def test_builtin_spec_gets_the_sandbox_and_compute_score_kwargs():
    from rlpost.reward.custom import reward_fn_spec
    from rlpost.sandbox.client import SandboxSlots

    cfg = compose("reward_model.sandbox_fusion.url=http://h:1/run_code", "reward_model.sandbox_fusion.max_concurrent=3",
                  "reward_model.sandbox_fusion.memory_limit_mb=700", "+reward.compute_score_kwargs.timeout=4")
    kwargs = reward_fn_spec(cfg).kwargs
    assert kwargs == {"timeout": 4, "sandbox_fusion_url": "http://h:1/run_code", "memory_limit_mb": 700,
                      "concurrent_semaphore": SandboxSlots(3, "http://h:1/run_code")}
    assert reward_fn_spec(compose()).kwargs == {}
    assert reward_fn_spec(compose("reward_model.sandbox_fusion.url=local")).kwargs == {}  # set once it started
