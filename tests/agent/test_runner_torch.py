"""Multi-turn episodes on a real engine (tiny random Qwen2): the sampled ids and their log-probs are
exactly what a teacher-forced forward over the final sequence gives, observations included in context."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from stratarl.agent.batch_edge import trajectories_to_batch
from stratarl.agent.interactions.answer_check import AnswerCheckInteraction
from stratarl.agent.runner import AgentLoopRunner
from stratarl.agent.template_check import compare_with_template
from stratarl.agent.tool_loop import LoopLimits
from stratarl.rollout.interface import SamplingParams
from stratarl.rollout.torch_engine import TorchRolloutEngine
from tests.agent.conftest import prompt_row


def tiny_lm(vocab: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def test_multi_turn_log_probs_match_a_teacher_forced_forward(renderer, tokenizer):
    model = tiny_lm(len(tokenizer))
    engine = TorchRolloutEngine(
        model, eos_token_ids=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, seed=0
    )
    interaction = AnswerCheckInteraction({"max_attempts": 3}, name="check")
    extra = {"interaction_kwargs": {"name": "check", "ground_truth": "56088"}}
    rows = [
        prompt_row(renderer, q, request_id=str(i), extra_info=extra)
        for i, q in enumerate(["What is 123*456?", "2+2?"] * 2)
    ]
    runner = AgentLoopRunner(
        engine, renderer, LoopLimits(response_budget=120), interactions={"check": interaction}
    )
    # a random model rarely samples EOS: let every third id end a turn, so episodes have several turns
    sampling = SamplingParams(
        temperature=1.0, max_tokens=12, stop_token_ids=tuple(range(4, len(tokenizer), 3))
    )
    trajectories = runner.run_sync(rows, sampling, seed=7)
    assert sum(t.num_user_turns for t in trajectories) >= 4  # observations really are interleaved

    batch, _ = trajectories_to_batch(trajectories, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits
    P = batch["prompts"].shape[1]
    log_probs = torch.log_softmax(logits[:, P - 1 : -1].float(), dim=-1)  # predicts response token t
    teacher = log_probs.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)  # [N, T]
    mask = batch["response_mask"].bool()
    assert torch.allclose(teacher[mask], batch["rollout_log_probs"][mask], atol=1e-4)
    assert (batch["rollout_log_probs"][~mask] == 0).all()
    for t in trajectories:
        report = compare_with_template(tokenizer, t)
        # the prompt always agrees; a random model may sample a non-canonical tokenization of its own
        # text, which the report locates inside the response (our ids keep what was sampled)
        assert report.agrees or report.first_mismatch >= len(t.prompt_ids)
