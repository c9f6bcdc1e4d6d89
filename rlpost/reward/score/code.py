"""Code scorers: run the response's program on its test cases in a SandboxFusion-compatible sandbox.

Test cases (`ground_truth`, a dict or its JSON string), as codecontests / APPS / TACO / PRIME (Eurus) store them:
- stdin/stdout: `{"inputs": [stdin, ...], "outputs": [expected stdout, ...]}`;
- call-based: the same plus `"fn_name"`: each input holds the JSON arguments, one per line; the function
  (or the method of a `Solution` class) is called and its JSON result compared with the expected value;
- assert-based: `{"assert_case": [python asserts, ...]}`: each case is the program plus its asserts.

The score is the pass fraction of the first `max_cases` cases (`continuous`, verl's partial credit), or 1.0 only
when every case passes. A compile error stops at the first case. The dict result carries `score`,
`sandbox_pass_rate`, `sandbox_status` (passed, wrong_answer, no_code, bad_tests, or the sandbox's reason:
runtime_error, wall_time, cpu_time, memory, output_limit, syscall_denied, compile_error, sandbox_error) and
`sandbox_seconds` (the slowest case).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import re
from typing import Any

from rlpost import keys
from rlpost.sandbox.client import run_code

logger = logging.getLogger(__name__)
FAILURES = ("wrong_answer", "runtime_error", "compile_error", "wall_time", "cpu_time", "memory", "output_limit",
            "syscall_denied", "sandbox_error", "no_code", "bad_tests")
CODE_BLOCK = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
OPEN_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*)\Z", re.DOTALL)
LANGUAGE_NAMES = {"python": "python", "py": "python", "python3": "python", "cpp": "cpp", "c++": "cpp"}
CALL_HARNESS = '''

def __rlpost_call():
    import json as _json, sys as _sys
    _args = [_json.loads(_line) for _line in _sys.stdin.read().splitlines() if _line.strip()]
    _fn = globals().get({name!r})
    if _fn is None and "Solution" in globals():
        _fn = getattr(globals()["Solution"](), {name!r})
    if _fn is None:
        raise SystemExit("function {name} is not defined")
    print(_json.dumps(_fn(*_args)))

__rlpost_call()
'''


def extract_code(completion: str) -> tuple[str | None, str]:
    """(code, language) of the last fenced code block, or of an opening fence never closed (a response cut at
    its length limit, as verl reads it); (None, "python") without a fence."""
    text = completion or ""
    blocks = CODE_BLOCK.findall(text)
    opened = OPEN_FENCE.search(text[text.rfind("```"):]) if text.count("```") % 2 else None
    if opened:
        tag, code = opened.groups()
    elif blocks:
        tag, code = blocks[-1]
    else:
        return None, "python"
    return code, LANGUAGE_NAMES.get(tag.lower(), "python")


def problem_with_tests(ground_truth: Any) -> str | None:
    """What makes `ground_truth` unusable as test cases (one phrase naming the field), or None when it is usable."""
    tests = ground_truth
    if isinstance(tests, (str, bytes)):
        try:
            tests = json.loads(tests)
        except ValueError as err:
            return f"is not valid JSON ({err})"
    if not isinstance(tests, dict):
        return f"is a JSON {type(tests).__name__}, not an object with 'inputs' and 'outputs' (or 'assert_case')"
    if "assert_case" in tests:
        cases = tests["assert_case"]
        if not isinstance(cases, list) or not cases or not all(isinstance(c, str) for c in cases):
            return "has 'assert_case' that is not a non-empty list of strings (Python assert statements)"
        return None
    inputs, outputs = tests.get("inputs"), tests.get("outputs")
    missing = [k for k, v in (("inputs", inputs), ("outputs", outputs)) if v is None]
    if missing:
        return f"has no {' or '.join(repr(k) for k in missing)} (keys: {sorted(tests)})"
    for name, value in (("inputs", inputs), ("outputs", outputs)):
        if not isinstance(value, list):
            return f"has {name!r} of type {type(value).__name__}, not a list"
    if not inputs:
        return "has empty 'inputs' (no test case)"
    if len(inputs) != len(outputs):
        return f"has {len(inputs)} 'inputs' but {len(outputs)} 'outputs'"
    if tests.get("fn_name") is not None and not isinstance(tests["fn_name"], str):
        return f"has 'fn_name' of type {type(tests['fn_name']).__name__}, not a string"
    return None


def parse_tests(ground_truth: Any) -> dict[str, Any] | None:
    """The test-case dict, or None when it has no usable cases (`problem_with_tests` says why)."""
    if problem_with_tests(ground_truth) is not None:
        return None
    tests = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else ground_truth
    if "assert_case" in tests:
        n = len(tests["assert_case"])
        return {"inputs": [""] * n, "outputs": [None] * n, "assert_case": tests["assert_case"]}
    return {"inputs": tests["inputs"], "outputs": tests["outputs"], "fn_name": tests.get("fn_name")}


def same_output(actual: str, expected: Any) -> bool:
    """stdout equality, line by line with trailing spaces and trailing empty lines ignored; else token by token."""
    if expected is None:
        return True
    if isinstance(expected, list):
        expected = "\n".join(map(str, expected))
    exp, act = str(expected), actual or ""
    if [ln.rstrip() for ln in exp.rstrip().splitlines()] == [ln.rstrip() for ln in act.rstrip().splitlines()]:
        return True
    return exp.split() == act.split()


def same_value(actual: str, expected: Any) -> bool:
    """A call-based result: JSON equal to the expected value, or to its only element (APPS wraps it in a list)."""
    try:
        value = json.loads(actual.strip())
    except ValueError:
        return False
    expected = json.loads(json.dumps(expected))  # tuples compare as the lists JSON gives back
    return value == expected or (isinstance(expected, list) and len(expected) == 1 and value == expected[0])


def _case_program(code: str, tests: dict[str, Any], i: int) -> tuple[str, str]:
    """(program, stdin) of case i."""
    if tests.get("assert_case"):
        return f"{code}\n\n{tests['assert_case'][i]}\n", ""
    stdin = tests["inputs"][i]
    if tests.get("fn_name"):
        if isinstance(stdin, list):  # arguments given as a list rather than JSON lines
            stdin = "\n".join(json.dumps(arg) for arg in stdin)
        return code + CALL_HARNESS.format(name=tests["fn_name"]), str(stdin)
    return code, str(stdin)


def run_case(url: str, code: str, language: str, tests: dict, i: int, timeout: float, memory_limit_mb: int,
             slots: Any) -> tuple[str, float]:
    """(status, seconds) of case i: passed, wrong_answer, or the sandbox's reason."""
    program, stdin = _case_program(code, tests, i)
    response = run_code(url, program, stdin, language=language, run_timeout=timeout, compile_timeout=timeout,
                        memory_limit_mb=memory_limit_mb, slots=slots)
    run = response.get("run_result") or {}
    seconds = float(run.get("execution_time") or 0.0)
    status = response.get("status")
    if status == "Success":
        expected = tests["outputs"][i]
        ok = (same_value if tests.get("fn_name") else same_output)(run.get("stdout") or "", expected)
        return ("passed" if ok else "wrong_answer"), seconds
    if status == "Failed":
        return _failure_reason(response), seconds
    return "sandbox_error", seconds


def _failure_reason(response: dict) -> str:
    """rlpost's `reason`, or for the real SandboxFusion the same names read from its stage results."""
    if response.get("reason"):
        return response["reason"]
    compiled, run = response.get("compile_result") or {}, response.get("run_result") or {}
    if compiled and (compiled.get("status") != "Finished" or compiled.get("return_code")):
        return "compile_error"
    if run.get("status") == "TimeLimitExceeded":
        return "wall_time"
    return "memory" if "MemoryError" in (run.get("stderr") or "") else "runtime_error"


def compute_score(sandbox_fusion_url: str, completion: str, test_cases: Any, *, continuous: bool = True,
                  timeout: float = 10.0, memory_limit_mb: int = 1024, concurrent_semaphore: Any = None,
                  max_cases: int = 10) -> dict[str, Any]:
    """Score one response; see the module docstring for the result."""
    code, language = extract_code(completion)
    if code is None:
        return _result(0.0, 0.0, "no_code", 0.0)
    tests = parse_tests(test_cases)
    if tests is None:
        return _result(0.0, 0.0, "bad_tests", 0.0)
    n = min(len(tests["inputs"]), max_cases) if continuous else len(tests["inputs"])
    statuses: list[str] = [""] * n
    seconds = 0.0
    first = run_case(sandbox_fusion_url, code, language, tests, 0, timeout, memory_limit_mb, concurrent_semaphore)
    statuses[0], seconds = first
    if first[0] not in ("compile_error", "compile_timeout") and n > 1:
        with cf.ThreadPoolExecutor(max_workers=min(n - 1, 8)) as pool:
            futures = {pool.submit(run_case, sandbox_fusion_url, code, language, tests, i, timeout, memory_limit_mb,
                                   concurrent_semaphore): i for i in range(1, n)}
            for future, i in futures.items():
                statuses[i], case_s = future.result()
                seconds = max(seconds, case_s)
    else:
        statuses = [first[0]] * n
    passed = sum(s == "passed" for s in statuses)
    rate = passed / n
    failed = next((s for s in statuses if s != "passed"), "passed")
    score = rate if continuous else float(passed == n)
    if failed in ("wall_time", "cpu_time") or seconds >= timeout / 2:
        logger.warning("slow program (%.2f s, %s, sandbox timeout %s s): %r", seconds, failed, timeout, code[:400])
    return _result(score, rate, failed, seconds)


def sandbox_metrics(extra: dict[str, Any], top: int = 3) -> dict[str, float]:
    """`reward/sandbox/*` of a batch from its per-sample extras (rows without a code sample are None):
    pass_rate (mean over samples), solved (fraction of samples passing every case), <failure>_count for each of
    `FAILURES`, max_seconds (slowest case), slowest_<k>_seconds for the `top` slowest samples (k = 1 first)."""
    statuses = extra.get("sandbox_status")
    if statuses is None:
        return {}
    rows = [i for i, s in enumerate(statuses) if s is not None]
    if not rows:
        return {}
    metrics = {"reward/sandbox/pass_rate": sum(float(extra["sandbox_pass_rate"][i]) for i in rows) / len(rows),
               "reward/sandbox/solved": sum(statuses[i] == "passed" for i in rows) / len(rows),
               "reward/sandbox/max_seconds": max(float(extra["sandbox_seconds"][i]) for i in rows)}
    for failure in FAILURES:
        metrics[f"reward/sandbox/{failure}_count"] = float(sum(statuses[i] == failure for i in rows))
    for k, (_, seconds, _) in enumerate(slowest_samples(extra, top), start=1):
        metrics[f"reward/sandbox/slowest_{k}_seconds"] = seconds
    return metrics


def slowest_samples(extra: dict[str, Any], top: int = 3) -> list[tuple[str, float, str]]:
    """The `top` slowest code samples of a batch, slowest first: (name, seconds, status). The name is the
    sample's data source and its prompt's row in the data file (`index`), else its row in the batch."""
    statuses = extra.get("sandbox_status")
    if statuses is None:
        return []
    rows = sorted((i for i, s in enumerate(statuses) if s is not None),
                  key=lambda i: -float(extra["sandbox_seconds"][i]))[:top]
    sources, index = extra.get(keys.DATA_SOURCE), extra.get(keys.INDEX)
    out = []
    for i in rows:
        source = sources[i] if sources is not None else "code"
        where = f"row {index[i]}" if index is not None else f"batch row {i}"
        out.append((f"{source} {where}", float(extra["sandbox_seconds"][i]), str(statuses[i])))
    return out


def format_slowest(samples: list[tuple[str, float, str]]) -> str:
    """One log line's worth: `apps row 12: 3.20 s (wall_time), ...`."""
    return ", ".join(f"{name}: {seconds:.2f} s ({status})" for name, seconds, status in samples)


def _result(score: float, rate: float, status: str, seconds: float) -> dict[str, Any]:
    return {"score": float(score), "sandbox_pass_rate": float(rate), "sandbox_status": status,
            "sandbox_seconds": round(float(seconds), 4)}
