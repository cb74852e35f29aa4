"""Benchmark: one verified weight sync into the torch rollout engine, against a plain in-place copy
of the same tensors in the same run.

The model is a tiny Qwen2 preset (`stratarl.data.tiny_models`, random weights); the sync is
`TorchRolloutEngine.load_weights` (strict keys, buckets, change detection, the sender's and the
receiver's checksums, the final check that the served tensors hold what arrived); the baseline is
`copy_` of every tensor into the served model, with no checks. Times are the best of `--repeats`;
the ratio is sync / copy (lower is better).

    OMP_NUM_THREADS=2 python benchmarks/weight_sync.py --size 50m --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from stratarl.data.tiny_models import MODEL_PRESETS
from stratarl.rollout.torch_engine import TorchRolloutEngine
from stratarl.rollout.weight_sync import tensor_bytes


def tiny_qwen2(size: str, seed: int, vocab_size: int = 1024) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab_size, tie_word_embeddings=True, **MODEL_PRESETS[size])
    return Qwen2ForCausalLM(config).eval()


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="50m", choices=list(MODEL_PRESETS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    served, trained = tiny_qwen2(args.size, seed=0), tiny_qwen2(args.size, seed=1)
    engine = TorchRolloutEngine(served, eos_token_ids=2, pad_token_id=3)
    state = trained.state_dict()
    versions = iter(range(1, 10_000))
    sync_s = best_of(args.repeats, lambda: engine.load_weights(state, next(versions)))
    held = served.state_dict()

    @torch.no_grad()
    def copy_all() -> None:
        for name, tensor in state.items():
            held[name].copy_(tensor)

    copy_s = best_of(args.repeats, copy_all)
    result = {
        "size": args.size,
        "megabytes": tensor_bytes(state) / 1e6,
        "threads": torch.get_num_threads(),
        "sync_s": sync_s,
        "copy_s": copy_s,
        "ratio": sync_s / copy_s,
    }
    print(
        f"{args.size}: {result['megabytes']:.0f} MB, {result['threads']} threads: verified sync "
        f"{sync_s * 1e3:.1f} ms, in-place copy {copy_s * 1e3:.1f} ms, ratio {result['ratio']:.1f}×"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
