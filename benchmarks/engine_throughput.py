"""Training-engine throughput on a ragged batch: the padded forward (before) vs packed rows (after).

For each model size, one ragged batch of N rows (prompts U[16, P], responses U[8, T] tokens):

  before  the batch-edge layout [N, P+T] as is, micro-batches of 4 rows, the HF forward making logits
          at every position and a log-softmax over them (the engine before issue 5)
  after   packed rows (no padding), micro-batches by a token budget, per-row attention, the chunked
          head on response positions only (`engine.Actor`)

Reported: padded share of the computed token positions, real tokens/s, and MFU = model FLOPs
(`engine.perf.ModelFlops`, real tokens only) / seconds / the fp32 matmul peak measured in the same
run with the same thread count. Timings are the best of --repeats; one process, OMP_NUM_THREADS=1.

    OMP_NUM_THREADS=1 python benchmarks/engine_throughput.py [--sizes 10m 50m] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from stratarl.data.tiny_models import MODEL_PRESETS
from stratarl.engine.actor import Actor, OptimizerSettings
from stratarl.engine.micro_batches import model_inputs, plan_micro_batches
from stratarl.engine.packing import padding_share
from stratarl.engine.perf import ModelFlops, measured_matmul_peak
from stratarl.engine.requests import UpdateRequest
from stratarl.transport.data_proto import DataProto


def ragged_batch(rows: int, max_prompt: int, max_response: int, vocab: int, seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(16, max_prompt + 1, (rows,), generator=g)
    r_len = torch.randint(8, max_response + 1, (rows,), generator=g)
    prompt_mask = (torch.arange(max_prompt) >= max_prompt - p_len[:, None]).long()
    response_mask = (torch.arange(max_response) < r_len[:, None]).long()
    responses = torch.randint(4, vocab, (rows, max_response), generator=g) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.cat(
        [torch.randint(4, vocab, (rows, max_prompt), generator=g) * prompt_mask, responses], 1
    )
    columns = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "responses": responses,
        "response_mask": response_mask,
        "advantages": torch.randn(rows, max_response, generator=g) * response_mask,
    }
    return DataProto.from_dict(columns)


def pg_loss(log_prob, micro, num_tokens):
    return -(micro["advantages"] * log_prob * micro["response_mask"]).sum() / num_tokens


def before_pass(model, batch, grad: bool) -> int:
    """Padded forward (+ backward); returns the token positions computed."""
    num_tokens, width = int(batch["response_mask"].sum()), batch["responses"].shape[1]
    for micro in batch.split(4):
        with torch.set_grad_enabled(grad):
            logits = model(
                input_ids=micro["input_ids"],
                attention_mask=micro["attention_mask"],
                position_ids=micro["position_ids"],
                use_cache=False,
            ).logits[:, -width - 1 : -1]
            log_prob = torch.log_softmax(logits.float(), -1).gather(-1, micro["responses"][..., None])[..., 0]
            if grad:
                pg_loss(log_prob, micro, num_tokens).backward()
    return batch["input_ids"].numel()


def after_pass(actor, batch, grad: bool) -> int:
    num_tokens, computed = int(batch["response_mask"].sum()), 0
    for rows in plan_micro_batches(batch, actor.batching, actor.dp):
        inputs = model_inputs(batch, rows, actor.batching.layout)
        computed += inputs.computed_tokens
        with torch.set_grad_enabled(grad):
            scores = actor._forward(inputs, with_entropy=False)
            if grad:
                pg_loss(scores.log_prob, batch.take(rows), num_tokens).backward()
    return computed


def best_time(fn, repeats: int) -> tuple[float, int]:
    best, computed = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        computed = fn()
        best = min(best, time.perf_counter() - start)
    return best, computed


def cpu_pressure() -> str:
    path = Path("/proc/pressure/cpu")
    return path.read_text().split()[1] if path.exists() else "n/a"


def bench_size(size: str, args, peak: float) -> dict:
    config = Qwen2Config(
        vocab_size=args.vocab, tie_word_embeddings=True, max_position_embeddings=1024, **MODEL_PRESETS[size]
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    batch = ragged_batch(args.rows, args.max_prompt, args.max_response, args.vocab)
    seq_lens = batch["attention_mask"].sum(1).tolist()
    flops = ModelFlops.from_config(config)
    scored = int(batch["response_mask"].sum())
    train_flops = flops.train_flops(seq_lens, scored)
    actor = Actor(
        model,
        optim=OptimizerSettings(lr=1e-5),
        micro_batch_size=4,
        max_tokens_per_micro_batch=args.budget,
        peak_flops=peak,
    )
    out = {"size": size, "params": sum(p.numel() for p in model.parameters()), "real_tokens": sum(seq_lens)}
    for name, fn in (
        ("before", lambda g: before_pass(model, batch, g)),
        ("after", lambda g: after_pass(actor, batch, g)),
    ):
        model.zero_grad(set_to_none=True)
        seconds, computed = best_time(lambda fn=fn: fn(True), args.repeats)
        infer_seconds, _ = best_time(lambda fn=fn: fn(False), args.repeats)
        out[name] = {
            "padding_share": padding_share(computed, sum(seq_lens)),
            "fwd_bwd_s": seconds,
            "tokens_per_s": sum(seq_lens) / seconds,
            "mfu": train_flops / seconds / peak,
            "logprob_s": infer_seconds,
            "logprob_tokens_per_s": sum(seq_lens) / infer_seconds,
        }
    start = time.perf_counter()
    metrics = actor.update(
        batch,
        lambda micro, scores, totals: (pg_loss(scores.log_prob, micro, totals.num_tokens), {}),
        UpdateRequest(mini_batch_size=len(batch)),
    )
    out["after"]["update_s"] = time.perf_counter() - start
    out["after"]["update_mfu_reported"] = metrics["perf/mfu/actor"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["10m", "50m"])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--max-prompt", type=int, default=128)
    parser.add_argument("--max-response", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument(
        "--budget", type=int, default=2048, help="max_tokens_per_micro_batch of the packed run"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    pressure_before = cpu_pressure()
    peak = measured_matmul_peak(torch.float32, "cpu", 2048)
    print(f"threads={torch.get_num_threads()} measured fp32 matmul peak {peak / 1e9:.1f} GFLOP/s (n=2048)")
    results = []
    for size in args.sizes:
        r = bench_size(size, args, peak)
        results.append(r)
        b, a = r["before"], r["after"]
        print(f"\n{size} ({r['params'] / 1e6:.1f}M params), N={args.rows}, {r['real_tokens']} real tokens")
        print(f"{'':>8} {'padding':>8} {'fwd+bwd s':>10} {'tok/s':>8} {'MFU':>6} {'logprob tok/s':>14}")
        for name, x in (("before", b), ("after", a)):
            print(
                f"{name:>8} {x['padding_share']:>8.1%} {x['fwd_bwd_s']:>10.2f} {x['tokens_per_s']:>8.0f} "
                f"{x['mfu']:>6.1%} {x['logprob_tokens_per_s']:>14.0f}"
            )
        print(
            f"  after/before: fwd+bwd {b['fwd_bwd_s'] / a['fwd_bwd_s']:.2f}x, "
            f"log-prob {b['logprob_s'] / a['logprob_s']:.2f}x"
        )
        print(
            f"  Actor.update (with AdamW): {a['update_s']:.2f} s, "
            f"perf/mfu/actor {a['update_mfu_reported']:.1%}"
        )
    pressure_after = cpu_pressure()
    print(f"\nCPU pressure /proc/pressure/cpu {pressure_before} -> {pressure_after} (0 = quiet machine)")
    if args.json:
        payload = {"peak_flops": peak, "args": vars(args) | {"json": str(args.json)}, "results": results}
        payload["cpu_pressure"] = [pressure_before, pressure_after]
        args.json.write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
