"""Benchmark: the GRPO part of the GPU check — a bf16 GRPO run of a few steps in one process, measured.

Run by benchmarks/gpu_check.sh. The policy trains in fp32 master weights with bf16 compute
(actor.fsdp.param_dtype=bfloat16), the rollout serves a bf16 copy (rollout.dtype=bfloat16), and the
colocated hand-off is on (the KV cache freed for training, the optimizer state in CPU memory while
generating). Per step it reads the run's
own metrics: seconds per phase, tokens/s (perf/throughput: prompt + response tokens of the step over
its seconds), rollout tokens/s (response tokens over timing_s/gen), MFU of the actor update against the
device's datasheet peak (perf/mfu/actor), the allocator's peak (perf/max_memory_allocated_gb) and the
memory the hand-off moved. The first step is reported apart (CUDA and kernel warm-up).

Models (--model): `smollm2-shape` — SmolLM2-135M's config and real tokenizer with random weights (the
dequantized model, ~540 MB, is too big to travel to a machine that cannot download; the shape gives
the real FLOPs, not the real text); `tiny` — the factory's 50M Qwen2 on a locally trained tokenizer;
or a path to any local HF causal LM directory. Without CUDA it runs the same on the CPU (--device cpu
or auto), which is how its parts are checked on a machine with no GPU.

    python benchmarks/gpu_check.py --out /tmp/gpu-check --json gpu_check.json
    python benchmarks/gpu_check.py --device cpu --model tiny --steps 2 --prompts 4 --n 2 \\
        --max-response-tokens 16 --json /tmp/cpu.json          # the CPU dry run
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHAPE_DIR = ROOT / ".gpu-carry" / "smollm2-shape"  # config.json + tokenizer files (make gpu-bundle)
PER_STEP = (
    "perf/throughput",
    "perf/mfu/actor",
    "perf/max_memory_allocated_gb",
    "perf/rollout_cache_released_gb",
    "perf/optimizer_offloaded_gb",
    "response_length/mean",
    "critic/score/mean",
    "actor/grad_norm",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("/tmp/stratarl-gpu-check"), help="run directories")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--model", default="auto", help="auto | smollm2-shape | tiny | PATH to an HF model dir")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--steps", type=int, default=5, help="GRPO steps (the first is warm-up)")
    p.add_argument("--prompts", type=int, default=32, help="prompts per step (B)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-response-tokens", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=64, help="trajectories per micro-batch")
    p.add_argument("--no-hand-off", action="store_true", help="rollout.free_cache_engine=false, no offload")
    args = p.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False")
    if args.model == "auto":
        args.model = "smollm2-shape" if (SHAPE_DIR / "config.json").is_file() else "tiny"
    return args


def make_model(kind: str, out: Path, train_file: Path) -> tuple[Path, str]:
    """(model directory, what it is)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from stratarl.data.tiny_models import build_tiny_model, count_parameters
    from stratarl.data.tokenizer_factory import corpus_from_parquet

    if kind == "tiny":
        model_dir = build_tiny_model(
            out / "model", size="50m", corpus_texts=corpus_from_parquet([train_file]), seed=0
        )
        return model_dir, "factory Qwen2 50m preset, random init, local tokenizer"
    if kind == "smollm2-shape":
        if not (SHAPE_DIR / "config.json").is_file():
            raise SystemExit(f"{SHAPE_DIR} is missing: run `make gpu-bundle` after `make real-model`")
        config = AutoConfig.from_pretrained(SHAPE_DIR)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model_dir = out / "smollm2-shape"
        model.save_pretrained(model_dir)
        AutoTokenizer.from_pretrained(SHAPE_DIR).save_pretrained(model_dir)
        return model_dir, f"SmolLM2-135M shape ({count_parameters(model) / 1e6:.1f}M), random init"
    path = Path(kind)
    if not (path / "config.json").is_file():
        raise SystemExit(f"--model {kind}: not smollm2-shape, tiny or an HF model directory")
    return path, f"HF model directory {path}"


def grpo_overrides(args: argparse.Namespace, task: dict[str, Path], model_dir: Path) -> list[str]:
    hand_off = not args.no_hand_off
    return [
        f"data.train_files=[{task['train']}]",
        f"data.val_files=[{task['test']}]",
        f"model.path={model_dir}",
        f"cluster.device={args.device}",
        "actor.fsdp.param_dtype=bfloat16",
        "rollout.dtype=bfloat16",
        f"rollout.free_cache_engine={str(hand_off).lower()}",
        f"actor.fsdp.optimizer_offload={str(hand_off and args.device == 'cuda').lower()}",
        f"data.prompts_per_step={args.prompts}",
        f"rollout.n={args.n}",
        f"rollout.max_response_tokens={args.max_response_tokens}",
        f"rollout.trajectories_per_generate_batch={args.prompts * args.n}",
        f"actor.prompts_per_mini_batch={args.prompts}",
        f"actor.trajectories_per_micro_batch={min(args.micro_batch, args.prompts * args.n)}",
        "actor.lr=1e-5",
        f"trainer.total_steps={args.steps}",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        "trainer.val_before_train=false",
        "trainer.logger=[jsonl]",
    ]


def summarise(records: list[dict], trajectories: int) -> dict:
    """Steady state (steps after the first) as means, and the first step on its own; `trajectories`
    per step turn the mean response length into the response tokens the rollout made."""
    steady = records[1:] or records
    phases = sorted({k for r in records for k in r if k.startswith("timing_s/")})
    names = [k for k in (*phases, *PER_STEP) if any(k in r for r in steady)]
    mean = {k: statistics.mean(r[k] for r in steady if k in r) for k in names}
    out = {"steady_steps": len(steady), "mean": {k: round(v, 6) for k, v in mean.items()}}
    generated = sum(r["response_length/mean"] * trajectories for r in steady)
    out["rollout_tokens_per_s"] = round(generated / max(sum(r["timing_s/gen"] for r in steady), 1e-9), 1)
    out["first_step"] = {k: records[0][k] for k in ("timing_s/step", "perf/throughput") if k in records[0]}
    out["peak_memory_gb"] = max(r.get("perf/max_memory_allocated_gb", 0.0) for r in records)
    return out


def environment(device: str) -> dict:
    from stratarl.engine.perf import gpu_peak_flops

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device,
        "threads": torch.get_num_threads(),
    }
    import transformers

    env["transformers"] = transformers.__version__
    if device == "cuda":
        name = torch.cuda.get_device_name()
        env |= {
            "gpu": name,
            "gpu_memory_gb": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
            "peak_bf16_tflops": (gpu_peak_flops(name, torch.bfloat16) or 0) / 1e12 or "not in the table",
        }
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from stratarl.apps.quickstart import RECIPE
    from stratarl.config import load_config
    from stratarl.data.tasks.arithmetic import make_arithmetic_dataset
    from stratarl.observe.run_log import read_metrics
    from stratarl.trainer.rl_trainer import RLTrainer

    args.out.mkdir(parents=True, exist_ok=True)
    task = make_arithmetic_dataset(args.out / "data", n_train=512, n_test=16, digits=2, seed=0)
    start = time.perf_counter()
    model_dir, model_note = make_model(args.model, args.out, task["train"])
    prepared_s = time.perf_counter() - start
    run_dir = args.out / f"run-{args.device}-{int(time.time())}"
    cfg = load_config(RECIPE, grpo_overrides(args, task, model_dir))
    start = time.perf_counter()
    RLTrainer(cfg, run_dir).fit()
    wall_s = time.perf_counter() - start
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]
    result = {
        "environment": environment(args.device),
        "model": model_note,
        "settings": vars(args) | {"out": str(args.out), "json": str(args.json)},
        "model_prepared_s": round(prepared_s, 1),
        "train_wall_s": round(wall_s, 1),
        "steps": len(records),
        **summarise(records, args.prompts * args.n),
    }
    mean = result["mean"]
    print(
        f"GRPO on {args.device} ({model_note}): {mean.get('perf/throughput', 0):.0f} tokens/s, "
        f"rollout {result.get('rollout_tokens_per_s', 0):.0f} response tokens/s, "
        f"MFU (actor update) {100 * mean.get('perf/mfu/actor', 0):.2f} %, "
        f"peak {result['peak_memory_gb']:.2f} GB, {mean.get('timing_s/step', 0):.2f} s/step"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
