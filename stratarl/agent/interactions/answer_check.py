"""Layer 5, agent loops: a simulated user that checks the model's final answer and may ask again.

After each assistant turn it reads `Answer: <integer>` at the end of the model's last message and
compares it with the sample's `ground_truth` (from `interaction_kwargs`). Right: the episode ends
with score 1. Wrong or missing: score 0, and the user says so and asks again, until
`max_attempts` answers have been judged (then the episode ends). As verl's Gsm8kInteraction.
"""

from __future__ import annotations

from typing import Any

from stratarl.agent.interactions.base import Interaction, InteractionReply
from stratarl.reward.tool_arithmetic import parse_final_answer


class AnswerCheckInteraction(Interaction):
    """config: {max_attempts: 2, retry_text: "..."}; per sample: interaction_kwargs {ground_truth}."""

    async def respond(self, instance_id: str, messages: list[dict[str, Any]]) -> InteractionReply:
        state = self.instances.setdefault(instance_id, {})
        state["attempts"] = state.get("attempts", 0) + 1
        last = next((m["content"] for m in reversed(messages) if m.get("role") == "assistant"), "")
        predicted = parse_final_answer(str(last))
        expected = str(state.get("ground_truth", "")).strip()
        if predicted is not None and str(predicted) == expected:
            return InteractionReply("Correct.", should_terminate=True, score=1.0)
        out_of_attempts = state["attempts"] >= int(self.config.get("max_attempts", 2))
        text = self.config.get("retry_text", "That is not right. Check your work and answer again.")
        return InteractionReply(text, should_terminate=out_of_attempts, score=0.0)
