"""Interactions: the answer-checking simulated user and the YAML registry."""

import asyncio

import pytest

from stratarl.agent.interactions.answer_check import AnswerCheckInteraction
from stratarl.agent.interactions.base import interactions_from_config, load_interactions


def test_answer_check_judges_and_limits_attempts():
    async def episode():
        interaction = AnswerCheckInteraction({"max_attempts": 2})
        first = await interaction.start(None, ground_truth="12")
        wrong = await interaction.respond(first, [{"role": "assistant", "content": "Answer: 11"}])
        last = await interaction.respond(first, [{"role": "assistant", "content": "no idea"}])
        second = await interaction.start(None, ground_truth="12")
        right = await interaction.respond(
            second, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Answer: 12"}]
        )
        await interaction.finalize(first)
        await interaction.finalize(second)
        return interaction, wrong, last, right

    interaction, wrong, last, right = asyncio.run(episode())
    assert (wrong.should_terminate, wrong.score) == (False, 0.0)
    assert (last.should_terminate, last.score) == (True, 0.0)
    assert (right.should_terminate, right.score, right.text) == (True, 1.0, "Correct.")
    assert interaction.name == "answercheck" and interaction.instances == {}


def test_registry_from_yaml(tmp_path):
    path = tmp_path / "interactions.yaml"
    path.write_text(
        "interaction:\n"
        "  - name: checker\n"
        "    class_name: stratarl.agent.interactions.answer_check.AnswerCheckInteraction\n"
        "    config: {max_attempts: 3}\n"
    )
    interactions = load_interactions(path)
    assert list(interactions) == ["checker"] and interactions["checker"].config == {"max_attempts": 3}
    with pytest.raises(TypeError, match="Interaction"):
        interactions_from_config(
            {"interaction": [{"class_name": "stratarl.agent.tools.calculator.CalculatorTool"}]}
        )
    with pytest.raises(ValueError, match="interaction"):
        interactions_from_config({"tools": []})
