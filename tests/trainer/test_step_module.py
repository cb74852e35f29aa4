"""The step module's promises (docs/design.md#one-step): it reads frozen settings, not the run's
config; no phase tests an estimator's name; two phases writing one metric fail, naming both."""

import ast
from pathlib import Path

import pytest

from stratarl.config import load_config
from stratarl.trainer.step import EXTRA_ROLLOUTS, extra_rollouts
from stratarl.trainer.step_metrics import MetricClash, StepMetrics
from stratarl.trainer.step_settings import StepSettings

TRAINER = Path(__file__).resolve().parents[2] / "stratarl" / "trainer"


def test_the_step_reads_no_run_config():
    tree = ast.parse((TRAINER / "step.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m and m.startswith("stratarl.config") for m in imported)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert "cfg" not in names and "RunConfig" not in names


def test_no_trainer_module_compares_the_estimator_to_a_name():
    """ReMax's extra rollout comes from the field its estimator reads, not `adv_estimator == "remax"`."""
    found = []
    for path in TRAINER.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                reads_estimator = any(
                    isinstance(s, ast.Attribute) and s.attr == "adv_estimator" for s in sides
                )
                if reads_estimator and any(isinstance(s, ast.Constant) for s in sides):
                    found.append(f"{path.name}:{node.lineno}")
    assert found == []


def test_remax_declares_its_greedy_rollout_and_grpo_none():
    remax = StepSettings.from_config(load_config(None, ["algorithm.adv_estimator=remax"]))
    grpo = StepSettings.from_config(load_config(None, ["algorithm.adv_estimator=grpo"]))
    assert extra_rollouts(remax.estimator_inputs) == ("reward_baselines",)
    assert EXTRA_ROLLOUTS["reward_baselines"] == "gen_max"
    assert extra_rollouts(grpo.estimator_inputs) == ()


def test_settings_are_frozen_and_carry_the_config_values():
    cfg = load_config(None, ["rollout.n=3", "actor.ppo_epochs=2", "algorithm.filter_groups.enable=true"])
    settings = StepSettings.from_config(cfg)
    assert (settings.n, settings.actor_update.epochs, settings.group_filter.metric) == (3, 2, "score")
    with pytest.raises(AttributeError):
        settings.n = 4  # frozen: resolved once
    with pytest.raises(TypeError):
        settings.advantage_hyperparameters["gamma"] = 0.5  # a read-only view


def test_two_phases_writing_one_metric_fail_naming_both():
    metrics = StepMetrics()
    metrics.add("update_critic", {"perf/max_memory_allocated_gb": 1.0})
    with pytest.raises(MetricClash, match="'update_critic' and 'update_actor'"):
        metrics.add("update_actor", {"perf/max_memory_allocated_gb": 2.0})


def test_diagnostics_fill_only_the_names_no_phase_wrote():
    metrics = StepMetrics()
    metrics.add("update_actor", {"rollout_corr/kl": 0.5})
    metrics.add_missing({"rollout_corr/kl": 9.0, "rollout/staleness/mean": 0.0})
    assert metrics.values == {"rollout_corr/kl": 0.5, "rollout/staleness/mean": 0.0}
