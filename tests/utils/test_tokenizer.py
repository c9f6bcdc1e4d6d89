"""`auto_tokenizer`: transformers' AutoTokenizer without scikit-learn loaded, and scikit-learn still importable."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_CHECK = """
import sys
from rlpost.utils.tokenizer import auto_tokenizer

cls = auto_tokenizer()
import transformers
assert cls is transformers.AutoTokenizer
loaded = sorted(m for m in ("sklearn", "pandas") if m in sys.modules)
import sklearn.metrics
print(loaded, type(sklearn.metrics.roc_curve).__name__)
"""


@pytest.mark.timeout(120)
def test_auto_tokenizer_leaves_sklearn_out_and_importable():
    # a fresh interpreter: this test process may have imported transformers or scikit-learn already
    out = subprocess.run([sys.executable, "-c", _CHECK], cwd=REPO, capture_output=True, text=True, timeout=110,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[] function"


def test_normalize_token_ids_flattens_every_tokenizer_output():
    import numpy as np
    import torch

    from rlpost.utils.tokenizer import normalize_token_ids

    class Encoding(dict):  # a BatchEncoding is a dict subclass with input_ids
        pass

    assert normalize_token_ids([1, 2, 3]) == [1, 2, 3]
    assert normalize_token_ids([[4, 5]]) == [4, 5]
    assert normalize_token_ids(torch.tensor([[6, 7]])) == [6, 7]
    assert normalize_token_ids(np.array([8, 9])) == [8, 9]
    assert normalize_token_ids(Encoding(input_ids=[[1, 2]], attention_mask=[[1, 1]])) == [1, 2]
    assert normalize_token_ids((3, 4)) == [3, 4]
    with pytest.raises(ValueError, match="a batch of 2 sequences"):
        normalize_token_ids([[1], [2]])
    with pytest.raises(ValueError, match="without input_ids"):
        normalize_token_ids({"ids": [1]})
    with pytest.raises(ValueError, match="one list of int ids"):
        normalize_token_ids(["a"])
