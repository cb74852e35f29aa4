"""The quickstart's promise, end to end (slow): GRPO raises held-out greedy accuracy over SFT."""

import json

import pytest

from stratarl.trainer.quickstart import run_quickstart


@pytest.mark.slow
def test_grpo_beats_the_sft_checkpoint_on_held_out_problems(tmp_path):
    summary = run_quickstart(tmp_path, seed=0)
    assert summary["accuracy_after_grpo"] - summary["accuracy_after_sft"] >= 0.15, summary
    assert json.loads((tmp_path / "summary.json").read_text())["seed"] == 0
    assert (tmp_path / "grpo" / "curves.png").exists()
