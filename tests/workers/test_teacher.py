"""Which rows each distillation teacher scores (`rows_of_teacher`)."""

import numpy as np
import pytest

from rlpost.workers.teacher import rows_of_teacher


def test_one_unkeyed_teacher_scores_every_row():
    masks = rows_of_teacher(np.array(["a", "b", "c"], dtype=object), {"t": None})
    assert masks["t"].tolist() == [True, True, True]


def test_teachers_by_data_source():
    values = np.array(["gsm8k", "geo", "gsm8k"], dtype=object)
    masks = rows_of_teacher(values, {"math": "gsm8k", "geometry": "geo"})
    assert masks["math"].tolist() == [True, False, True]
    assert masks["geometry"].tolist() == [False, True, False]


def test_a_row_no_teacher_claims_is_named():
    with pytest.raises(ValueError, match="teacher key value 'code' matches no distillation.teacher_models"):
        rows_of_teacher(np.array(["gsm8k", "code"], dtype=object), {"math": "gsm8k", "geometry": "geo"})


def test_several_unkeyed_teachers_all_score_every_row():
    masks = rows_of_teacher(np.array(["a", "b"], dtype=object), {"t1": None, "t2": None})
    assert masks["t1"].tolist() == masks["t2"].tolist() == [True, True]
