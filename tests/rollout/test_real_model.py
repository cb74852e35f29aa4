"""SmolLM2-135M-Instruct through the rollout: token-in/token-out (the chat template's ids are the ids
trained on, nothing re-tokenized), log-probs = a teacher-forced HF forward, and multi-turn tool and
user-feedback trajectories that equal the model's own template rendering, token for token."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stratarl.agent.batch_edge import trajectories_to_batch
from stratarl.agent.interactions.answer_check import AnswerCheckInteraction
from stratarl.agent.rendering import ChatRenderer, encode, render_text
from stratarl.agent.runner import AgentLoopRunner
from stratarl.agent.template_check import compare_with_template
from stratarl.agent.tool_loop import LoopLimits
from stratarl.agent.tools.calculator import CalculatorTool
from stratarl.data.prompt_dataset import load_prompt_dataset
from stratarl.data.tasks.arithmetic import make_arithmetic_dataset
from stratarl.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine, results_to_batch
from tests.agent.scripted_engine import ScriptedEngine
from tests.data.real_model import real_model_dir

pytestmark = pytest.mark.real_model
SYSTEM_PROMPT = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(real_model_dir())


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(real_model_dir()).eval()


@pytest.fixture(scope="module")
def engine(model, tokenizer):
    return TorchRolloutEngine(
        model, eos_token_ids=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, seed=0
    )


@torch.no_grad()
def teacher_forced(model, batch, temperature: float = 1.0) -> torch.Tensor:
    """[N, T] log_softmax(z/τ) of each response token from one padded forward over the batch edge."""
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
    ).logits
    P = batch["prompts"].shape[1]
    log_probs = torch.log_softmax(logits[:, P - 1 : -1].float() / temperature, dim=-1)
    return log_probs.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


def test_token_in_token_out_and_log_probs(tmp_path, tokenizer, model, engine):
    paths = make_arithmetic_dataset(tmp_path, n_train=4, n_test=6, digits=2, seed=0)
    dataset = load_prompt_dataset(paths["test"], tokenizer, max_prompt_tokens=128)
    requests = []
    for i, item in enumerate(dataset):
        # the dataset's ids are the template's text tokenized once: no second BOS, the system prompt once
        text = render_text(tokenizer, item.messages, add_generation_prompt=True)
        assert item.prompt_ids == encode(tokenizer, text) and text.count(SYSTEM_PROMPT) == 1
        requests.append(
            GenerationRequest(f"{i}/g", item.prompt_ids, SamplingParams(temperature=0, max_tokens=24))
        )
        requests += [
            GenerationRequest(f"{i}/{k}", item.prompt_ids, SamplingParams(max_tokens=24, seed=k))
            for k in range(2)
        ]
    results = engine.generate(requests)
    batch = results_to_batch(results, pad_token_id=tokenizer.pad_token_id)
    for i, result in enumerate(results):
        row = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        assert row == list(result.prompt_ids) + list(result.response_ids)  # the sampled ids, as they came
    for item, result in zip(dataset, results[::3], strict=True):  # greedy replies
        if result.finish_reason != "stop":
            continue
        reply = tokenizer.decode(result.response_ids[:-1])  # without the EOS that ended it
        conversation = [*item.messages, {"role": "assistant", "content": reply}]
        template = encode(tokenizer, render_text(tokenizer, conversation, add_generation_prompt=False))
        ours = list(result.prompt_ids) + list(result.response_ids)
        assert template[: len(ours)] == ours and tokenizer.decode(template[len(ours) :]) == "\n"
    mask = batch["response_mask"].bool()
    expected = teacher_forced(model, batch)
    torch.testing.assert_close(batch["rollout_log_probs"][mask], expected[mask], atol=1e-4, rtol=1e-4)


def tool_call(expression: str) -> str:
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def test_a_tool_trajectory_is_the_templates_rendering_token_for_token(tokenizer):
    """Scripted replies (the model does not call tools unprompted), its real tokenizer and template."""
    renderer = ChatRenderer(tokenizer)
    messages = [{"role": "user", "content": "What is 4821*937? Use the calculator."}]
    row = {"prompt_ids": renderer.prompt_ids(messages), "messages": messages, "request_id": "e"}
    replies = {"e": [tool_call("4821*937"), tool_call("4517277+1"), "Answer: 4517278"]}
    runner = AgentLoopRunner(
        ScriptedEngine(tokenizer, replies), renderer, LoopLimits(response_budget=200),
        tools={"calculator": CalculatorTool()},
    )  # fmt: skip
    [trajectory] = runner.run_sync([row], SamplingParams(max_tokens=64))
    assert (trajectory.num_assistant_turns, trajectory.num_user_turns) == (3, 2)
    report = compare_with_template(tokenizer, trajectory)
    assert report.agrees, report.context
    assert tokenizer.decode(report.suffix) == "\n"  # only the template's closing newline is left
    text = tokenizer.decode(trajectory.prompt_ids + trajectory.response_ids)
    assert text.count(SYSTEM_PROMPT) == 1  # observations never repeat the default system prompt
    assert "<|im_start|>tool\n4517277<|im_end|>\n<|im_start|>assistant\n" in text
    observation = [
        t for t, m in zip(trajectory.response_ids, trajectory.response_mask, strict=True) if m == 0
    ]
    assert "4517278" in tokenizer.decode(observation)  # the tool's results are masked out of the loss


def test_a_multi_turn_episode_of_the_real_model(tokenizer, model, engine):
    """The model answers, a simulated user checks the answer and asks again: the model's turns are its
    own samples, the conversation is the template's, the log-probs are a teacher-forced forward's."""
    renderer = ChatRenderer(tokenizer)
    interaction = AnswerCheckInteraction({"max_attempts": 2}, name="check")
    rows = []
    for i, (question, truth) in enumerate([("What is 57 + 68?", "125"), ("What is 9 + 16?", "25")]):
        messages = [{"role": "user", "content": f"{question} End your reply with 'Answer: <integer>'."}]
        extra = {"interaction_kwargs": {"name": "check", "ground_truth": truth}}
        rows.append({"prompt_ids": renderer.prompt_ids(messages), "messages": messages, "request_id": str(i),
                     "extra_info": extra})  # fmt: skip
    runner = AgentLoopRunner(
        engine, renderer, LoopLimits(response_budget=160), interactions={"check": interaction}
    )
    trajectories = runner.run_sync(rows, SamplingParams(temperature=0.0, max_tokens=48))
    assert any(t.num_user_turns >= 1 for t in trajectories)  # a wrong answer got a second turn
    for t in trajectories:
        report = compare_with_template(tokenizer, t)
        assert report.agrees, report.context  # greedy replies are canonical tokenizations
    batch, _ = trajectories_to_batch(trajectories, pad_token_id=tokenizer.pad_token_id)
    mask = batch["response_mask"].bool()
    expected = teacher_forced(model, batch)
    torch.testing.assert_close(batch["rollout_log_probs"][mask], expected[mask], atol=1e-4, rtol=1e-4)
