"""Benchmark: what an agent program's own `openai` client costs per episode through the gateway.

The quickstart's task and untrained 1M model, one Gateway over a TorchRolloutEngine, E episodes of
the same two-call program (the held-out questions, 4 tokens a call, greedy), which differ only in
how they make their client:

- `per episode`: `async with AsyncOpenAI(base_url, api_key)` in every episode (docs/agent_gateway.md's
  pattern). The client's HTTP pool builds a TLS context and loads the CA bundle, even for http://.
- `per episode, verify=False`: the same with `http_client=DefaultAsyncHttpxClient(verify=False)`: no
  CA bundle is loaded (the gateway is plain HTTP on 127.0.0.1: nothing is verified either way).
- `one pool`: one `DefaultAsyncHttpxClient` for every episode of the event loop, a light
  `AsyncOpenAI` per episode on top of it.

Reported: wall seconds for all episodes, per episode, and the ratio to `one pool` (the floor).

    OMP_NUM_THREADS=1 python benchmarks/gateway_client_overhead.py --episodes 128 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
from openai import AsyncOpenAI, DefaultAsyncHttpxClient
from transformers import AutoModelForCausalLM, AutoTokenizer

from stratarl.agent.gateway.episodes import InProcessAgent, run_episodes
from stratarl.agent.gateway.server import Gateway
from stratarl.agent.rendering import ChatRenderer
from stratarl.apps.quickstart import TaskSettings, build_task
from stratarl.rollout.interface import SamplingParams
from stratarl.rollout.torch_engine import TorchRolloutEngine


async def two_calls(client: AsyncOpenAI, row: dict) -> None:
    messages = list(row["messages"])
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}, messages[0]]


async def per_episode(base_url: str, api_key: str, row: dict) -> None:
    async with AsyncOpenAI(base_url=base_url, api_key=api_key) as client:
        await two_calls(client, row)


async def per_episode_no_ca(base_url: str, api_key: str, row: dict) -> None:
    http = DefaultAsyncHttpxClient(verify=False)
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http) as client:
        await two_calls(client, row)


POOL: dict[asyncio.AbstractEventLoop, DefaultAsyncHttpxClient] = {}


async def one_pool(base_url: str, api_key: str, row: dict) -> None:
    http = POOL.setdefault(asyncio.get_running_loop(), DefaultAsyncHttpxClient())
    await two_calls(AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http), row)


AGENTS = {"per episode": per_episode, "per episode, verify=False": per_episode_no_ca, "one pool": one_pool}


def measure(engine: TorchRolloutEngine, renderer: ChatRenderer, rows: list[dict], agent) -> float:
    async def main() -> float:
        sampling = SamplingParams(temperature=0.0, max_tokens=4)
        async with Gateway(engine, renderer, sampling=sampling, max_prompt_tokens=1024, seed=0,
                           keep_sampled_ids=True) as gateway:  # fmt: skip
            start = time.perf_counter()
            captures = await run_episodes(
                gateway, InProcessAgent(agent, timeout_s=300), rows, max_concurrent=len(rows)
            )
            elapsed = time.perf_counter() - start
        assert all(c.status == "done" and len(c.calls) == 2 for c in captures), captures[0].error
        for client in POOL.values():
            await client.aclose()
        POOL.clear()
        return elapsed

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each variant; the fastest counts")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        paths, model_dir = build_task(Path(tmp), TaskSettings(), seed=0)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        questions = [r["prompt"] for r in pq.read_table(paths["train"]).to_pylist()]
    engine = TorchRolloutEngine(
        model, eos_token_ids=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    renderer = ChatRenderer(tokenizer)
    rows = [{"messages": list(questions[i % len(questions)])} for i in range(args.episodes)]
    measure(engine, renderer, rows[:8], one_pool)  # warm-up: imports, first engine call
    seconds = {
        name: min(measure(engine, renderer, rows, a) for _ in range(args.repeats))
        for name, a in AGENTS.items()
    }
    floor = seconds["one pool"]
    print(f"\n{args.episodes} episodes × 2 calls")
    print("| client | s, all episodes | ms / episode | × one pool |\n|---|---|---|---|")
    for name, s in seconds.items():
        print(f"| {name} | {s:.2f} | {1000 * s / args.episodes:.1f} | {s / floor:.2f} |")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"episodes": args.episodes, "seconds": seconds}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
