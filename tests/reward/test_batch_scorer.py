"""Batch scoring: one score per sample, extras collected, a raising or bad scorer gives 0 and is counted."""

import math

import numpy as np
import pytest
import torch

from stratarl.reward.batch_scorer import score_batch
from stratarl.reward.registry import UnknownDataSourceError


def _fragile(data_source, solution_str, ground_truth, extra_info=None):
    """Raises on "boom", returns odd things on request, else 1.0 when the response equals the truth."""
    if solution_str == "boom":
        raise ZeroDivisionError("division by zero in scorer")
    odd = {
        "none": None,
        "nan": math.nan,
        "nokey": {"acc": 1.0},
        "np": np.float32(0.5),
        "t": torch.tensor(0.25),
        "bool": np.bool_(True),
        "str": "1.0",
    }
    if solution_str in odd:
        return odd[solution_str]
    return float(solution_str == ground_truth)


def test_arithmetic_batch_with_extras_and_metrics():
    result = score_batch(["arithmetic"] * 3, ["Answer: 3", "Answer: 4", "3"], ["3", "3", "3"])
    assert result.scores.dtype == torch.float32 and result.scores.tolist() == [1.0, 0.0, 0.0]
    assert result.extra["format_ok"] == [1.0, 1.0, 0.0]
    metrics = result.metrics()
    assert metrics["reward/acc/mean"] == pytest.approx(1 / 3)
    assert metrics["reward/format_ok/mean"] == pytest.approx(2 / 3)
    assert metrics["reward/failures/total"] == 0.0 and result.failures == {}


def test_raising_and_bad_returns_score_zero_and_are_counted():
    responses = ["a", "boom", "x", "boom", "none", "nan", "nokey", "np", "t", "bool", "str"]
    truths = ["a", "a", "x"] + ["a"] * 8
    result = score_batch(["toy"] * 11, responses, truths, compute_score=_fragile)
    assert result.scores.tolist() == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.25, 1.0, 0.0]
    assert result.failures == {"ZeroDivisionError": 2, "bad_return": 3, "non_finite": 1}
    metrics = result.metrics()
    assert metrics["reward/failures/ZeroDivisionError"] == 2.0 and metrics["reward/failures/total"] == 6.0
    assert result.failure_examples[0].startswith("sample 1 (toy): ZeroDivisionError: division by zero")
    assert result.extra["acc"][6] == 1.0  # extras of a dict without "score" are still kept


def test_unknown_data_source_is_a_setup_error():
    with pytest.raises(UnknownDataSourceError):
        score_batch(["nope"], ["Answer: 1"], ["1"])


def test_length_mismatch_is_refused():
    with pytest.raises(ValueError, match="ground_truths=1"):
        score_batch(["arithmetic"] * 2, ["a", "b"], ["1"])
    with pytest.raises(ValueError, match="extra_infos"):
        score_batch(["arithmetic"], ["a"], ["1"], [None, None])


def test_extra_infos_reach_the_scorer():
    seen = []

    def spy(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(extra_info)
        return 0.0

    score_batch(["s", "s"], ["a", "b"], [1, 2], [{"index": 7}, None], compute_score=spy)
    assert seen == [{"index": 7}, None]
