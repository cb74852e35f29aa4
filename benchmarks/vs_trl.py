"""Benchmark: one GRPO step of stratarl against TRL's `GRPOTrainer` on the same work, and both
against the machine's floor.

The same on both sides (each knob is printed with the table): the tiny Qwen2 models and tokenizer of
`stratarl.data` (or a real model directory), 256 arithmetic prompts and the same rule reward
(`stratarl.reward.arithmetic`), n = 8 samples per prompt, responses forced to exactly T tokens
(TRL: `min_new_tokens = max_completion_length`; stratarl: `rollout.min_response_tokens =
max_response_tokens`: EOS is not sampled before T tokens on either side),
temperature 1, one on-policy optimizer step per batch (one mini-batch, one epoch), token-mean loss,
PPO clip ε = 0.2, β = 0 (no reference), AdamW at lr 1e-5 without weight decay, grad clip 1, fp32,
2 torch threads, all B·n trajectories in one micro-batch.

Each run is a fresh process (so peak RSS is its own); runs alternate sides (TRL first on even
repeats) so that machine load hits both alike. Reported per row: median seconds per step after the
warm-up steps, generated tokens per second, per-phase medians, peak RSS, the stratarl/TRL ratio,
and the **floor**: the step's minimum FLOPs — generation (prefill + one-token decode steps with a KV
cache) and the update (forward + backward over prompt + response) — divided by the fp32 matmul peak
measured in the same run; each side's step is printed as a multiple of it. Beside it, the floor
counting memory traffic (`decode_roofline_s`): each decode step takes at least the time to read every
weight and each row's K and V at the read bandwidth measured in the same run.

    OMP_NUM_THREADS=2 python benchmarks/vs_trl.py --rows 10m-8,50m-8 --json out.json
    python benchmarks/vs_trl.py --rows smollm2-2 --real-model models/smollm2-135m-instruct

TRL comes from the `bench` extra (`pip install -e ".[bench]"`; `make bench` installs it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS = {  # name: (model: a tiny-model preset or "real", prompts per step B, response tokens T)
    "1m-8": ("1m", 8, 32),
    "10m-1": ("10m", 1, 32),
    "10m-8": ("10m", 8, 32),
    "50m-1": ("50m", 1, 32),
    "50m-8": ("50m", 8, 32),
    "10m-8-long": ("10m", 8, 256),  # generation-heavy
    "smollm2-2": ("real", 2, 32),  # SmolLM2-135M-Instruct (`--real-model DIR`)
}
N, LR, CLIP, THREADS = 8, 1e-5, 0.2, 2
KNOBS = (
    f"n={N}, T forced on both sides, temperature 1, one on-policy update per batch (1 mini-batch, "
    f"1 epoch), token-mean, clip ε={CLIP}, β=0, AdamW lr={LR} wd=0 in torch's fused kernel on both sides "
    f"(TRL's default optim; actor.adamw_impl=fused for stratarl), grad clip 1, fp32, "
    f"{THREADS} threads, one micro-batch; stratarl writes no trace and no trajectory records (TRL writes "
    f"neither); gradient checkpointing at each side's default: on for TRL (GRPOConfig's default), off "
    f"for stratarl (side stratarl-gc turns it on: the peak-RSS comparison at equal settings)"
)


# --- the work both sides share ---------------------------------------------------------------------
def prepare(workdir: Path, model: str, real_model: str | None) -> dict[str, str]:
    """The 256 prompts (parquet) and the model directory (built once per preset, cached)."""
    from stratarl.data.tasks.arithmetic import make_arithmetic_dataset
    from stratarl.data.tiny_models import build_tiny_model
    from stratarl.data.tokenizer_factory import corpus_from_parquet

    data = workdir / "data"
    if not (data / "train.parquet").exists():
        make_arithmetic_dataset(data, n_train=256, n_test=8, digits=2, seed=0)
    train = str(data / "train.parquet")
    if model == "real":
        if not real_model or not Path(real_model).is_dir():
            raise SystemExit("the real-model row needs --real-model DIR (stratarl model import-gguf)")
        return {"train": train, "model": str(Path(real_model).resolve())}
    model_dir = workdir / f"model-{model}"
    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir, size=model, corpus_texts=corpus_from_parquet([train]), seed=0)
    return {"train": train, "model": str(model_dir)}


def step_floor_flops(model_dir: str, prompt_lens: list[int], response_tokens: int) -> dict[str, float]:
    """Minimum FLOPs of one step: generation with a KV cache, then one forward + backward."""
    from transformers import AutoConfig

    from stratarl.engine.perf import ModelFlops

    flops = ModelFlops.from_config(AutoConfig.from_pretrained(model_dir))
    T = response_tokens
    gen = 0.0
    for P in prompt_lens:
        gen += flops.forward_flops([P], scored_tokens=1)  # prefill: the last position through the head
        # decode step t attends over P + t positions: one token through every matmul and the head
        gen += (2.0 * flops.block_params + 2.0 * flops.head_params) * (T - 1)
        gen += flops.attention_coeff * sum(P + t for t in range(1, T))
    update = flops.train_flops([P + T for P in prompt_lens], scored_tokens=len(prompt_lens) * T)
    return {"gen": gen, "update": update, "total": gen + update}


def decode_roofline_s(
    model_dir: str, prompt_lens: list[int], response_tokens: int, peak_flops: float, read_bandwidth: float
) -> dict[str, float]:
    """Generation's floor counting memory traffic too: the prefill at the FLOP peak, then each decode
    step of all rows at once takes max(FLOPs / peak, bytes read / bandwidth), where a step reads every
    weight once (the batch shares them) and each row's K and V over its P + t columns, fp32:

        bytes_t = 4·(N_block·L + d·V) + Σ_rows 4·2·L·h_kv·e·(P + t)
    """
    from transformers import AutoConfig

    from stratarl.engine.perf import ModelFlops

    config = AutoConfig.from_pretrained(model_dir)
    flops = ModelFlops.from_config(config)
    h_q = config.num_attention_heads
    h_kv = getattr(config, "num_key_value_heads", None) or h_q
    e = getattr(config, "head_dim", None) or config.hidden_size // h_q
    kv_bytes_per_column = 4 * 2 * config.num_hidden_layers * h_kv * e
    weight_bytes = 4 * (flops.block_params + flops.head_params)
    prefill = sum(flops.forward_flops([P], scored_tokens=1) for P in prompt_lens) / peak_flops
    decode = 0.0
    for t in range(1, response_tokens):
        step_flops = sum(2.0 * (flops.block_params + flops.head_params) + flops.attention_coeff * (P + t)
                         for P in prompt_lens)  # fmt: skip
        step_bytes = weight_bytes + kv_bytes_per_column * sum(P + t for P in prompt_lens)
        decode += max(step_flops / peak_flops, step_bytes / read_bandwidth)
    return {"gen": prefill + decode, "prefill": prefill, "decode": decode}


def measured_read_bandwidth() -> float:
    """Best bytes/s of summing a 512 MiB fp32 tensor (a read stream, as decode reads weights and KV)."""
    import torch

    x = torch.ones(128 * 1024 * 1024)
    best = float("inf")
    for rep in range(5):
        start = time.perf_counter()
        x.sum()
        if rep:  # the first pass warms up
            best = min(best, time.perf_counter() - start)
    return x.numel() * x.element_size() / best


# --- one side, in a child process -----------------------------------------------------------------
def trl_arithmetic_reward():
    """TRL's reward function for the arithmetic task: stratarl's rule reward on each conversational
    completion's text, against the dataset's `ground_truth` column (TRL passes columns by name)."""
    from stratarl.reward.arithmetic import compute_score

    def reward(completions, ground_truth, **_):
        texts = [c[0]["content"] for c in completions]
        return [
            compute_score("arithmetic", t, gt)["score"] for t, gt in zip(texts, ground_truth, strict=True)
        ]

    return reward


def run_trl(paths: dict[str, str], B: int, T: int, steps: int, out: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from stratarl.data.schema import read_rows

    rows = read_rows(paths["train"])
    dataset = Dataset.from_list(
        [{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows]
    )
    reward = trl_arithmetic_reward()
    args = GRPOConfig(
        output_dir=str(out.parent / "trl-out"), per_device_train_batch_size=B * N,
        gradient_accumulation_steps=1, num_generations=N, max_completion_length=T,
        generation_kwargs={"min_new_tokens": T},
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, beta=0.0, epsilon=CLIP, loss_type="dapo", num_iterations=1,
        max_steps=steps, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, bf16=False,
        seed=0, dataloader_num_workers=0, disable_dropout=True,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(paths["model"])
    model = AutoModelForCausalLM.from_pretrained(paths["model"], dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    phases: dict[str, list[float]] = {"gen": [], "reward": [], "gen_and_score": [], "train_step": []}

    def timed(name: str, fn):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phases[name].append(time.perf_counter() - start)

        return wrapper

    trainer._generate = timed("gen", trainer._generate)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    trainer._generate_and_score_completions = timed("gen_and_score", trainer._generate_and_score_completions)
    trainer.training_step = timed("train_step", trainer.training_step)
    steps_s, rewards, lengths = [], [], []

    class StepClock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            steps_s.append(time.perf_counter() - self.start)

        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))
                lengths.append(float(logs["completions/mean_length"]))

    trainer.add_callback(StepClock())
    trainer.train()
    update = [t - g for t, g in zip(phases["train_step"], phases["gen_and_score"], strict=True)]
    return {
        "step_s": steps_s,
        "phases": {"gen": phases["gen"], "reward": phases["reward"], "update": update},
        "reward": rewards,
        "response_length": lengths,
    }


def run_stratarl(paths: dict[str, str], B: int, T: int, steps: int, out: Path, side: str) -> dict:
    """side: stratarl (defaults: π_old from the update's forward), stratarl-recompute (a separate
    old-log-prob forward, as before that removal), stratarl-bypass (π_old = π_rollout), stratarl-gc
    (the defaults with gradient checkpointing on, as TRL's GRPOConfig has it by default),
    stratarl-system-malloc (the defaults with cluster.host_allocator=system: glibc's own settings),
    stratarl-copy (the defaults with rollout.weight_sharing=copy: the engine's own copy of the weights,
    loaded and checked at every sync, as before weight sharing)."""
    from stratarl.config import load_config
    from stratarl.observe.run_log import read_metrics
    from stratarl.trainer.rl_trainer import RLTrainer

    overrides = [
        f"data.train_files=[{paths['train']}]", f"model.path={paths['model']}", "data.max_prompt_tokens=256",
        f"data.prompts_per_step={B}", f"rollout.n={N}", f"rollout.max_response_tokens={T}",
        f"rollout.min_response_tokens={T}", "rollout.temperature=1.0",
        f"rollout.trajectories_per_generate_batch={B * N}",
        f"actor.prompts_per_mini_batch={B}", f"actor.trajectories_per_micro_batch={B * N}", f"actor.lr={LR}",
        "actor.weight_decay=0.0", "actor.warmup_steps=0", "actor.lr_schedule=constant", "actor.grad_clip=1.0",
        "actor.adamw_impl=fused",  # TRL's default optimizer kernel (adamw_torch_fused)
        "actor.loss_agg_mode=token-mean", f"actor.policy_loss.clip_ratio_low={CLIP}",
        f"actor.policy_loss.clip_ratio_high={CLIP}", "algorithm.adv_estimator=grpo",
        f"trainer.total_steps={steps}",
        "trainer.test_freq=0", "trainer.val_before_train=false", "trainer.save_trajectories=false",
        "trainer.logger=[jsonl]", f"cluster.threads_per_worker={THREADS}", "trace.enable=false",
        *(["algorithm.rollout_correction.bypass_mode=true"] if side == "stratarl-bypass" else []),
        *(["actor.old_log_prob_from_update=false"] if side == "stratarl-recompute" else []),
        *(["model.gradient_checkpointing=true"] if side == "stratarl-gc" else []),
        *(["cluster.host_allocator=system"] if side == "stratarl-system-malloc" else []),
        *(["rollout.weight_sharing=copy"] if side == "stratarl-copy" else []),
    ]  # fmt: skip
    run_dir = out.parent / f"stratarl-run-{os.getpid()}"
    RLTrainer(load_config(None, overrides), run_dir).fit()
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]

    def column(key: str) -> list[float]:
        return [float(r.get(key, 0.0)) for r in train]

    return {
        "step_s": column("timing_s/step"),
        "phases": {
            "gen": column("timing_s/gen"),
            "reward": column("timing_s/reward"),
            "old_log_prob": column("timing_s/old_log_prob"),
            "update": column("timing_s/update_actor"),
            "sync": column("timing_s/update_weights"),
        },
        "reward": column("critic/score/mean"),
        "response_length": column("response_length/mean"),
    }


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(THREADS)
    model, B, T = ROWS[args.row]
    paths = prepare(Path(args.workdir), model, args.real_model)
    out = Path(args.out)
    if args.side.startswith("trl"):
        result = run_trl(paths, B, T, args.steps, out)
    else:
        result = run_stratarl(paths, B, T, args.steps, out, args.side)
    result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    out.write_text(json.dumps(result))


# --- the parent: alternate, summarize, compare with the floor --------------------------------------
def run_child(side: str, row: str, args: argparse.Namespace, workdir: Path) -> dict:
    out = workdir / f"{row}-{side}-{time.monotonic_ns()}.json"
    command = [sys.executable, __file__, "--child", side, "--row", row, "--steps", str(args.steps)]
    command += ["--workdir", str(workdir), "--out", str(out)]
    command += ["--real-model", args.real_model] if args.real_model else []
    env = os.environ | {"OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false"}
    if side == "trl-keep-malloc":  # what cluster.host_allocator=keep sets, given to TRL's process
        env |= {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL if not args.verbose else None)
    return json.loads(out.read_text())


def summarize(runs: list[dict], warmup: int, T: int, trajectories: int) -> dict:
    """Medians over every run's steps after the warm-up."""
    steps = [s for r in runs for s in r["step_s"][warmup:]]
    phases = {
        name: statistics.median(v for r in runs for v in r["phases"][name][warmup:])
        for name in runs[0]["phases"]
    }
    median = statistics.median(steps)
    return {
        "s_per_step": median,
        "tokens_per_s": trajectories * T / median,
        "phases_s": phases,
        "peak_rss_gb": max(r["peak_rss_gb"] for r in runs),
        "reward_mean": statistics.mean(v for r in runs for v in r["reward"]),
        "reward_last": statistics.mean(r["reward"][-1] for r in runs),  # after the same number of steps
        "response_length_mean": statistics.mean(v for r in runs for v in r["response_length"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1m-8,10m-1,10m-8,50m-1,50m-8,10m-8-long")
    parser.add_argument(
        "--sides",
        default="trl,stratarl,stratarl-recompute",
        help="also: stratarl-bypass, stratarl-gc, stratarl-system-malloc (cluster.host_allocator=system), "
        "stratarl-copy (rollout.weight_sharing=copy), trl-keep-malloc (TRL with the malloc settings of "
        "host_allocator=keep)",
    )
    parser.add_argument("--steps", type=int, default=5, help="steps per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="runs per side, alternating")
    parser.add_argument("--real-model", default=None)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--row", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.side = args.child
        return child(args)

    import torch

    from stratarl.engine.perf import measured_matmul_peak

    torch.set_num_threads(THREADS)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="vs-trl-"))
    sides = args.sides.split(",")
    peak = max(measured_matmul_peak(torch.float32), measured_matmul_peak(torch.float32, n=2049))
    bandwidth = measured_read_bandwidth()
    results = {"knobs": KNOBS, "versions": versions(), "matmul_peak_flops": peak, "rows": {}}
    results["read_bandwidth_bytes_per_s"] = bandwidth
    print(f"knobs: {KNOBS}\nversions: {results['versions']}")
    print(
        f"fp32 matmul peak ({THREADS} threads): {peak / 1e9:.1f} GFLOP/s; "
        f"read bandwidth {bandwidth / 1e9:.1f} GB/s\n"
    )
    for row in args.rows.split(","):
        model, B, T = ROWS[row]
        paths = prepare(workdir, model, args.real_model)
        runs: dict[str, list[dict]] = {side: [] for side in sides}
        for repeat in range(args.repeats):
            for side in sides if repeat % 2 == 0 else sides[::-1]:
                runs[side].append(run_child(side, row, args, workdir))
        summary = {side: summarize(r, args.warmup, T, B * N) for side, r in runs.items()}
        prompt_lens = prompt_lengths(paths, B)
        floor = step_floor_flops(paths["model"], prompt_lens, T)
        floor_s = floor["total"] / peak
        roofline = decode_roofline_s(paths["model"], prompt_lens, T, peak, bandwidth)
        roofline["total"] = roofline["gen"] + floor["update"] / peak
        results["rows"][row] = {"model": model, "B": B, "T": T, "floor_s": floor_s, "floor_flops": floor}
        results["rows"][row] |= {"roofline_floor_s": roofline, "sides": summary}
        print_row(row, summary, floor_s, {k: v / peak for k, v in floor.items()}, roofline)
        if args.json:  # after every row: a long run that is stopped keeps what it measured
            Path(args.json).write_text(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("stratarl", "trl", "torch", "transformers", "accelerate", "datasets"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found | {"python": sys.version.split()[0], "cpu": cpu_name(), "cores": str(os.cpu_count())}


def cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")


def prompt_lengths(paths: dict[str, str], B: int) -> list[int]:
    """Each trajectory's prompt length, from the first B prompts templated (the B·n of one step)."""
    from transformers import AutoTokenizer

    from stratarl.data.prompt_dataset import load_prompt_dataset

    dataset = load_prompt_dataset(
        paths["train"], AutoTokenizer.from_pretrained(paths["model"]), max_prompt_tokens=256
    )
    return [len(dataset[i].prompt_ids) for i in range(B) for _ in range(N)]


def print_row(
    row: str, summary: dict, floor_s: float, floor_parts: dict[str, float], roofline: dict[str, float]
) -> None:
    trl = summary.get("trl", {}).get("s_per_step")
    gen, update = floor_parts["gen"], floor_parts["update"]
    print(
        f"== {row}: floor {floor_s:.3f} s/step (gen {gen:.3f}, update {update:.3f}); counting memory "
        f"traffic {roofline['total']:.3f} (gen {roofline['gen']:.3f})"
    )
    for side, s in summary.items():
        ratio = f"{s['s_per_step'] / trl:.2f}× TRL" if trl else ""
        phases = " ".join(f"{k} {v:.3f}" for k, v in s["phases_s"].items())
        floors, roof = s["s_per_step"] / floor_s, s["s_per_step"] / roofline["total"]
        print(
            f"  {side:16s} {s['s_per_step']:.3f} s/step  {ratio:>10s}  {floors:.2f}× floor ({roof:.2f}× with "
            "memory)  "
            f"{s['tokens_per_s']:.0f} tok/s  rss {s['peak_rss_gb']:.2f} GB  "
            f"len {s['response_length_mean']:.1f}  "
            f"reward {s['reward_mean']:.3f} (last {s['reward_last']:.3f})  [{phases}]"
        )


if __name__ == "__main__":
    main()
