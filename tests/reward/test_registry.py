"""Reward registry: dispatch by data_source, and an unknown source named with the known ones."""

import pytest

from stratarl.reward.registry import SCORERS, UnknownDataSourceError, default_compute_score, scorer_for


def test_dispatch_by_data_source():
    assert default_compute_score("arithmetic", "Answer: 4", "4")["score"] == 1.0
    assert scorer_for("arithmetic") is SCORERS["arithmetic"]


def test_unknown_data_source_names_the_registered_ones():
    with pytest.raises(UnknownDataSourceError, match=r"'openai/gsm8k'.*registered: arithmetic"):
        default_compute_score("openai/gsm8k", "#### 4", "4")


def test_a_custom_table_is_used_when_given():
    table = {
        "echo": lambda data_source, solution_str, ground_truth, extra_info=None: float(solution_str == "x")
    }
    assert scorer_for("echo", table)("echo", "x", None) == 1.0
    with pytest.raises(UnknownDataSourceError):
        scorer_for("arithmetic", table)
