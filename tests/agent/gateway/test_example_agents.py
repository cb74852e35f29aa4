"""The example agent program examples/openai_agent/answer_then_check.py, loaded as the trainer loads
it, runs one episode against a real gateway: two chat calls (a reply, then the answer after a check),
the second prompt extending the first call's tokens so the episode is one row, the answer scored."""

import asyncio
from pathlib import Path

from stratarl.agent.gateway.agent_program import load_agent_function
from stratarl.agent.gateway.episode_rows import episode_trajectories
from stratarl.agent.gateway.episodes import InProcessAgent, run_episodes
from stratarl.agent.gateway.server import Gateway
from stratarl.reward.arithmetic import compute_score
from stratarl.rollout.interface import SamplingParams
from stratarl.rollout.torch_engine import TorchRolloutEngine
from tests.agent.scripted_engine import ScriptedEngine
from tests.agent.test_runner_torch import tiny_lm

AGENT = Path(__file__).resolve().parents[3] / "examples" / "openai_agent" / "answer_then_check.py"
ROW = {
    "messages": [{"role": "user", "content": "What is 3+4? Reply as 'Answer: <integer>'."}],
    "data_source": "arithmetic",
    "ground_truth": "7",
}


def one_episode(engine, renderer):
    agent = load_agent_function(str(AGENT), "run_episode")

    async def main():
        gateway = Gateway(
            engine,
            renderer,
            sampling=SamplingParams(max_tokens=64),
            max_prompt_tokens=512,
            seed=0,
            keep_sampled_ids=True,
        )
        async with gateway:
            (capture,) = await run_episodes(
                gateway, InProcessAgent(agent, timeout_s=60), [ROW], max_concurrent=1
            )
            return capture

    return asyncio.run(main())


def test_the_answer_then_check_agent_makes_two_calls_that_train_as_one_row(renderer, tokenizer):
    engine = ScriptedEngine(tokenizer, {"ep0": ["Answer: 8", "Answer: 7"]})
    capture = one_episode(engine, renderer)
    assert capture.status == "done" and capture.error is None and capture.reward is None  # it returned None
    thoughts, answer = capture.calls
    assert thoughts.prompt_ids == tuple(
        renderer.prompt_ids(ROW["messages"])
    )  # the question as the row has it
    second_prompt = tokenizer.decode(list(answer.prompt_ids))
    assert (
        second_prompt.count("What is 3+4?") == 2 and "Answer: 8" in second_prompt
    )  # asked again, its reply shown
    assert "Check your reply." in second_prompt
    assert capture.final_text == "Answer: 7"  # what the configured reward scores ...
    assert compute_score("arithmetic", capture.final_text, "7")["acc"] == 1.0  # ... and the rule pays for it
    rows = episode_trajectories(capture, max_response_tokens=128)
    assert rows.merged and len(rows.trajectories) == 1  # the answer's prompt extends the thoughts' tokens
    row = rows.trajectories[0]
    assert row.prompt_ids == list(thoughts.prompt_ids)
    trained = [t for t, m in zip(row.response_ids, row.response_mask, strict=True) if m]
    assert trained == [*thoughts.response_ids, *answer.response_ids]  # both calls' sampled ids, nothing else


def test_the_agent_runs_on_a_real_sampling_model_and_its_episode_still_merges(renderer, tokenizer):
    engine = TorchRolloutEngine(
        tiny_lm(len(tokenizer)),
        eos_token_ids=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        seed=0,
    )
    capture = one_episode(engine, renderer)
    assert capture.status == "done" and len(capture.calls) == 2
    assert (
        len(capture.calls[0].response_ids) <= 48 and len(capture.calls[1].response_ids) <= 16
    )  # its max_tokens
    rows = episode_trajectories(capture, max_response_tokens=256)
    assert rows.merged, rows.split_reason  # random text sent back keeps its sampled ids
