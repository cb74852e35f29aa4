"""Reward registry: dispatch by data_source, and an unknown source named with the known ones."""

import pytest

from stratarl.reward.registry import (
    SCORERS,
    LazyScorer,
    UnknownDataSourceError,
    default_compute_score,
    scorer_for,
)


def test_dispatch_by_data_source():
    assert default_compute_score("arithmetic", "Answer: 4", "4")["score"] == 1.0
    assert scorer_for("arithmetic") is SCORERS["arithmetic"]


def test_unknown_data_source_names_the_registered_ones():
    with pytest.raises(UnknownDataSourceError, match=r"'my/dataset'.*registered: .*arithmetic.*gsm8k"):
        default_compute_score("my/dataset", "#### 4", "4")


def test_shipped_data_sources():
    assert default_compute_score("openai/gsm8k", "#### 4", "4")["score"] == 1.0
    assert default_compute_score("tool_arithmetic", "Answer: 4", "4")["score"] == 1.0
    for source in ("math", "HuggingFaceH4/MATH-500", "codecontests", "apps"):
        assert source in SCORERS


def test_lazy_scorers_import_on_first_call_and_pickle_by_name():
    import pickle

    lazy = SCORERS["math"]
    assert isinstance(lazy, LazyScorer) and "math_answer" in repr(lazy)
    clone = pickle.loads(pickle.dumps(lazy))
    assert clone("math", "\\boxed{2}", "2")["score"] == 1.0


def test_a_custom_table_is_used_when_given():
    table = {
        "echo": lambda data_source, solution_str, ground_truth, extra_info=None: float(solution_str == "x")
    }
    assert scorer_for("echo", table)("echo", "x", None) == 1.0
    with pytest.raises(UnknownDataSourceError):
        scorer_for("arithmetic", table)
