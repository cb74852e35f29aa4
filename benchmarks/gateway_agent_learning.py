"""Benchmark: an agent program of the user's own learns under GRPO through the OpenAI-compatible gateway.

The agent is examples/openai_agent/answer_then_check.py: plain `openai` client code, two chat calls
per episode (answer, then check and answer again), returning None so the run's reward scores the
second answer.

Part 1, per seed, the quickstart's task (single-digit + and −, 160 train / 40 held out, 1M model):
1. the quickstart's data, tokenizer and model, and its SFT warm-start (single-turn answers: the
   SFT never shows the model the two-call conversation);
2. `stratarl train recipes/gateway_agent_arithmetic.yaml` from the SFT checkpoint for --steps steps:
   the quickstart's GRPO with the rollout as the agent program;
3. held-out accuracy of the agent program (the same two-call episode, greedy, through the gateway:
   the trainer's validation) before GRPO (step 0) and after; the quickstart's single-call greedy
   accuracy after SFT for reference; training reward per step, rows per episode (one merged row or
   one per call), seconds per step.
With --baseline, the same recipe with the gateway off (one call per episode, the built-in rollout,
the quickstart's 12-token budget) from the same SFT checkpoint for the same steps: the cost per step
and the learning of the plain rollout.

Part 2 (--real-model DIR): SmolLM2-135M-Instruct (`make real-model`) with its own chat template, the
same agent, a few GRPO steps (--real-steps) of recipes/grpo_smollm2_arithmetic.yaml on its additions
task; held-out reward and accuracy of the agent program before and after, seconds per step. Its
template renders no `tools`, hence the two-call form there (docs/agent_gateway.md).

    OMP_NUM_THREADS=2 python benchmarks/gateway_agent_learning.py --out /tmp/gw --seeds 0 1 --baseline \\
        --real-model .models/SmolLM2-135M-Instruct --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from stratarl.apps.quickstart import (
    TaskSettings,
    build_task,
    load_splits,
    save_sft_checkpoint,
    sft_step_budget,
)
from stratarl.assembly import datasets
from stratarl.cli import main as stratarl_main
from stratarl.config import load_config
from stratarl.observe.run_log import RunLog, read_metrics
from stratarl.trainer.sft import run_sft, sft_worker
from stratarl.trainer.validation import evaluate_accuracy, overall_accuracy

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "gateway_agent_arithmetic.yaml"
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
AGENT = ROOT / "examples" / "openai_agent" / "answer_then_check.py"
SMOLLM2_RECIPE = ROOT / "recipes" / "grpo_smollm2_arithmetic.yaml"
ROW_KEYS = ("agent/gateway_episodes", "agent/gateway_rows", "agent/gateway_rows_merged")
ROW_KEYS += (
    "agent/gateway_rows_per_call",
    "agent/gateway_split/not_a_prefix",
    "agent/gateway_split/over_budget",
)
ROW_KEYS += (
    "agent/gateway_prompts_kept_sampled_ids",
    "agent/gateway_calls/mean",
    "agent/gateway_episode_errors",
)


def sft_checkpoint(
    run_dir: Path, seed: int, task: TaskSettings, extra: list[str]
) -> tuple[dict[str, Path], Path, float]:
    """The quickstart's data, model and SFT (as `run_quickstart` runs them): the paths, the SFT
    directory, and the single-call greedy held-out accuracy after SFT."""
    datasets.seed_everything(seed)
    paths, model_dir = build_task(run_dir, task, seed)
    overrides = [f"data.train_files=['{paths['train']}']", f"data.val_files=['{paths['test']}']",
                 f"model.path={model_dir}", f"trainer.seed={seed}"]  # fmt: skip
    cfg = load_config(QUICKSTART, [*overrides, *extra])
    tokenizer = datasets.load_tokenizer(cfg)
    train_set, val_set = load_splits(cfg, tokenizer)
    steps = sft_step_budget(cfg, train_set)
    worker = sft_worker(cfg, tokenizer, steps)
    run_sft(worker, train_set, tokenizer, examples_per_step=cfg.sft.trajectories_per_step, total_steps=steps,
            max_tokens=cfg.sft.max_tokens, seed=seed, log=RunLog(run_dir / "sft"))  # fmt: skip
    accuracy, _, _ = evaluate_accuracy(worker, cfg, tokenizer, val_set, step=steps)
    return paths, save_sft_checkpoint(worker, tokenizer, run_dir), accuracy


def train(recipe: Path, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """`stratarl train RECIPE`; its train and val records and the wall time."""
    start = time.perf_counter()
    code = stratarl_main(["train", str(recipe), f"trainer.run_dir={run_dir}", *overrides])
    if code != 0:
        raise SystemExit(f"stratarl train exited {code}")
    records = read_metrics(run_dir / "metrics.jsonl")
    return {
        "train": [r for r in records if r["phase"] == "train"],
        "val": {int(r["step"]): r for r in records if r["phase"] == "val"},
        "wall_s": round(time.perf_counter() - start, 1),
    }


def step_summary(train_records: list[dict[str, Any]]) -> dict[str, Any]:
    """Reward per step, mean seconds per step (all, and steps 2.. without the first's warm-up), rows."""
    step_s = [r["timing_s/step"] for r in train_records]
    out = {
        "score_per_step": [round(r["critic/score/mean"], 4) for r in train_records],
        "step_s_mean": round(statistics.mean(step_s), 2),
        "step_s_mean_after_first": round(statistics.mean(step_s[1:] or step_s), 2),
        "gen_s_mean": round(statistics.mean(r["timing_s/gen"] for r in train_records), 2),
        "response_length_mean": round(statistics.mean(r["response_length/mean"] for r in train_records), 1),
    }
    for key in ROW_KEYS:
        if key in train_records[0]:
            out[key] = round(statistics.mean(r[key] for r in train_records), 2)
    return out


def tiny_seed(out: Path, seed: int, steps: int, baseline: bool, extra: list[str]) -> dict[str, Any]:
    task = TaskSettings()
    torch.set_num_threads(task.threads)  # as the quickstart: one thread, runs reproduce on one CPU type
    run_dir = out / f"seed{seed}"
    start = time.perf_counter()
    paths, sft_dir, single_call_sft = sft_checkpoint(run_dir, seed, task, extra)
    sft_s = round(time.perf_counter() - start, 1)
    common = [f"model.path={sft_dir}", f"data.train_files=['{paths['train']}']",
              f"data.val_files=['{paths['test']}']", f"trainer.seed={seed}", f"trainer.total_steps={steps}",
              f"trainer.test_freq={steps}"]  # fmt: skip
    agent = [f"agent.gateway.agent_function_path={AGENT}", "trainer.val_before_train=true"]
    gateway = train(RECIPE, run_dir / "gateway", [*common, *agent, *extra])
    row = {
        "seed": seed,
        "sft_s": sft_s,
        "single_call_after_sft": single_call_sft,
        "agent_before_grpo": overall_accuracy(gateway["val"][0], 1),
        "agent_after_grpo": overall_accuracy(gateway["val"][steps], 1),
        "gateway": step_summary(gateway["train"]) | {"wall_s": gateway["wall_s"]},
    }
    if baseline:
        single = [
            "agent.gateway.enable=false",
            "rollout.max_response_tokens=12",
            "trainer.val_before_train=false",
        ]
        plain = train(RECIPE, run_dir / "single_call", [*common, *single, *extra])
        row["single_call_after_grpo"] = overall_accuracy(plain["val"][steps], 1)
        row["single_call"] = step_summary(plain["train"]) | {"wall_s": plain["wall_s"]}
    print(json.dumps(row, indent=2), flush=True)
    return row


def real_model(out: Path, model: Path, steps: int, val_prompts: int, extra: list[str]) -> dict[str, Any]:
    """A few GRPO steps of the agent on SmolLM2 with its own chat template (no SFT)."""
    from real_model_grpo import make_task  # the additions task of benchmarks/real_model_grpo.py

    torch.set_num_threads(2)
    paths = make_task(out / "smollm2_data")
    overrides = [
        f"model.path={model}", f"data.train_files=['{paths['train']}']",
        f"data.val_files=['{paths['test']}']",
        "agent.gateway.enable=true", f"agent.gateway.agent_function_path={AGENT}",
        # 8 prompts × 4 episodes a step, one update; the row holds thoughts (≤ 48), follow-up, answer (≤ 16)
        "data.prompts_per_step=8", "rollout.n=4", "actor.prompts_per_mini_batch=8",
        "actor.trajectories_per_micro_batch=16", "rollout.max_response_tokens=128",
        f"data.max_val_prompts={val_prompts}", f"trainer.total_steps={steps}", f"trainer.test_freq={steps}",
        "trainer.val_before_train=true", *extra,
    ]  # fmt: skip
    run = train(SMOLLM2_RECIPE, out / "smollm2_run", overrides)
    before, after = run["val"][0], run["val"][steps]
    core = sorted(k for k in before if k.startswith("val-core/"))
    row = {
        "model": str(model),
        "steps": steps,
        "val_prompts": val_prompts,
        "before": {k: round(before[k], 4) for k in core},
        "after": {k: round(after[k], 4) for k in core},
        "run": step_summary(run["train"]) | {"wall_s": run["wall_s"]},
        "update_actor_s_mean": round(statistics.mean(r["timing_s/update_actor"] for r in run["train"]), 2),
    }
    print(json.dumps(row, indent=2), flush=True)
    return row


HEADER = ("seed", "single call after SFT", "agent before GRPO", "agent after GRPO", "gain (points)",
          "train score step 1 → last", "rows / episode", "s/step, agent", "s/step, single call")  # fmt: skip


def print_table(rows: list[dict[str, Any]]) -> None:
    print("\n| " + " | ".join(HEADER) + " |\n" + "|---" * len(HEADER) + "|")
    for r in rows:
        g, plain = r["gateway"], r.get("single_call", {})
        cells = [
            str(r["seed"]),
            f"{100 * r['single_call_after_sft']:.1f} %",
            f"{100 * r['agent_before_grpo']:.1f} %",
            f"{100 * r['agent_after_grpo']:.1f} %",
            f"{100 * (r['agent_after_grpo'] - r['agent_before_grpo']):+.1f}",
            f"{g['score_per_step'][0]:.3f} → {g['score_per_step'][-1]:.3f}",
            f"{g['agent/gateway_rows'] / g['agent/gateway_episodes']:.2f}",
            f"{g['step_s_mean']:.2f}",
            f"{plain['step_s_mean']:.2f}" if plain else "—",
        ]
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="folder for the data, checkpoints and runs")
    parser.add_argument(
        "--seeds", type=int, nargs="*", default=[0], help="quickstart seeds (none: skip part 1)"
    )
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps on the quickstart's task")
    parser.add_argument("--baseline", action="store_true", help="also the gateway off (one call)")
    parser.add_argument("--real-model", default=None, help="SmolLM2-135M-Instruct directory (part 2)")
    parser.add_argument("--real-steps", type=int, default=3, help="GRPO steps on the real model")
    parser.add_argument("--real-val-prompts", type=int, default=32, help="held-out prompts on the real model")
    parser.add_argument("--json", default=None)
    parser.add_argument("overrides", nargs="*", help="passed to the SFT's config and every stratarl train")
    args = parser.parse_args()
    out = Path(args.out)
    result: dict[str, Any] = {
        "tiny": [tiny_seed(out, s, args.steps, args.baseline, args.overrides) for s in args.seeds]
    }
    if result["tiny"]:
        print_table(result["tiny"])
    if args.real_model:
        result["smollm2"] = real_model(out, Path(args.real_model), args.real_steps, args.real_val_prompts,
                                       args.overrides)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
