"""Benchmark: TorchRolloutEngine against HF `model.generate` on the same work, in the same run.

Random-init Qwen2 models of the tiny-model factory's sizes; left-padded prompts of 14-15 tokens;
sampling at temperature 1 with top-k/top-p off; exactly `--new-tokens` tokens per sequence for both
(no EOS), fp32 on CPU. Reports new tokens per second and the ratio ours / HF, best of `--repeats`,
with the two measured alternately so that machine load hits both alike.

    OMP_NUM_THREADS=1 python benchmarks/rollout_generate.py --sizes 1m,10m --batches 16,64 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from stratarl.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine

SIZES = {  # hidden, layers, heads, kv heads, ffn (as in the tiny-model factory)
    "1m": (128, 4, 4, 2, 384),
    "10m": (256, 10, 8, 4, 1024),
    "50m": (512, 12, 8, 4, 2048),
}
VOCAB, PAD = 512, 3


def build_model(size: str) -> Qwen2ForCausalLM:
    hidden, layers, heads, kv_heads, ffn = SIZES[size]
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=ffn,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def make_prompts(batch: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(4, VOCAB, (14 + i % 2,), generator=g).tolist() for i in range(batch)]


def run_hf(model: Qwen2ForCausalLM, prompts: list[list[int]], new_tokens: int) -> int:
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), PAD)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :], mask[i, P - len(p) :] = torch.tensor(p), 1
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        top_k=0,
        top_p=1.0,
        temperature=1.0,
        min_new_tokens=new_tokens,
        max_new_tokens=new_tokens,
        pad_token_id=PAD,
        eos_token_id=None,
    )
    return (out.shape[1] - P) * len(prompts)


def run_ours(engine: TorchRolloutEngine, prompts: list[list[int]], new_tokens: int) -> int:
    sampling = SamplingParams(temperature=1.0, max_tokens=new_tokens)
    results = engine.generate([GenerationRequest(str(i), p, sampling) for i, p in enumerate(prompts)])
    return sum(len(r.response_ids) for r in results)


def best_rate(fn: Callable[[], int], timings: list[float]) -> float:
    start = time.perf_counter()
    tokens = fn()
    timings.append(time.perf_counter() - start)
    return tokens / min(timings)


def measure(size: str, batch: int, new_tokens: int, repeats: int) -> dict:
    model = build_model(size)
    engine = TorchRolloutEngine(model, eos_token_ids=(), pad_token_id=PAD, seed=0)
    prompts = make_prompts(batch)
    with torch.inference_mode():
        run_hf(model, prompts, 4)  # warm-up both paths
        run_ours(engine, prompts, 4)
        hf_times: list[float] = []
        our_times: list[float] = []
        for _ in range(repeats):
            hf_rate = best_rate(lambda: run_hf(model, prompts, new_tokens), hf_times)
            our_rate = best_rate(lambda: run_ours(engine, prompts, new_tokens), our_times)
    return {
        "model": size,
        "batch": batch,
        "new_tokens": new_tokens,
        "threads": torch.get_num_threads(),
        "hf_generate_tok_s": round(hf_rate, 1),
        "stratarl_tok_s": round(our_rate, 1),
        "ratio_stratarl_over_hf": round(our_rate / hf_rate, 3),
        "hf_best_s": round(min(hf_times), 4),
        "stratarl_best_s": round(min(our_times), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1m,10m", help="comma-separated, from " + ", ".join(SIZES))
    parser.add_argument("--batches", default="16,64", help="comma-separated sequences per call")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the rows to this path")
    args = parser.parse_args()
    rows = []
    for size in args.sizes.split(","):
        for batch in map(int, args.batches.split(",")):
            row = measure(size, batch, args.new_tokens, args.repeats)
            rows.append(row)
            print(
                f"{size:>4} B={batch:<3} HF {row['hf_generate_tok_s']:>8.0f} tok/s  "
                f"stratarl {row['stratarl_tok_s']:>8.0f} tok/s  ratio {row['ratio_stratarl_over_hf']:.2f}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
