"""Benchmark: GRPO on a real pretrained model on this machine's CPUs — SmolLM2-135M-Instruct on additions.

1. writes the task (additions of 1–2 digit numbers, the instruction "End your reply with 'Answer:
   <integer>'.", 2000 train / 100 held-out prompts) unless it is there;
2. scores the untouched model on the held-out prompts, greedy, with the recipe's reward file:
   `acc` (ends with the right `Answer: N`), `correct` (last integer right), `format_ok`, `exact`;
3. runs `stratarl train RECIPE` (any extra arguments are passed on as overrides, e.g. actor.lora.rank=16);
4. scores the trained model (`run/final`) the same way;
5. reports per-phase seconds (mean over steps of timing_s/*), tokens/s (perf/throughput), peak memory
   (the run's perf/max_memory_allocated_gb and the process's max RSS) and writes them with `--json`.

    OMP_NUM_THREADS=2 python benchmarks/real_model_grpo.py --out runs/bench-smollm2 --json out.json
    OMP_NUM_THREADS=2 python benchmarks/real_model_grpo.py --out runs/bench-smollm2-lora --json lora.json \\
        actor.lora.rank=16 actor.lora.alpha=32 actor.lr=1e-4
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stratarl.cli import main as stratarl_main
from stratarl.data.prompt_dataset import load_prompt_dataset
from stratarl.data.tasks.arithmetic import make_arithmetic_dataset
from stratarl.observe.run_log import read_metrics
from stratarl.reward.custom import load_custom_scorer
from stratarl.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "grpo_smollm2_arithmetic.yaml"
REWARD = ROOT / "recipes" / "rewards" / "arithmetic_answer_line.py"
INSTRUCTION = " End your reply with 'Answer: <integer>'."
SCORES = ("score", "acc", "correct", "format_ok", "exact")


def make_task(out: Path) -> dict[str, Path]:
    paths = {"train": out / "train.parquet", "test": out / "test.parquet"}
    if all(p.is_file() for p in paths.values()):
        return paths
    return make_arithmetic_dataset(
        out, n_train=2000, n_test=100, digits=(1, 2), operators="+", non_negative=True,
        instruction=INSTRUCTION, seed=0,
    )  # fmt: skip


@torch.no_grad()
def held_out_scores(model_dir: Path, test_file: Path, max_tokens: int) -> dict[str, float]:
    """Greedy replies to every held-out prompt, scored by the reward file: the mean of each score."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    engine = TorchRolloutEngine(
        model, eos_token_ids=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, seed=0
    )
    dataset = load_prompt_dataset(test_file, tokenizer, max_prompt_tokens=256)
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    results = engine.generate(
        [GenerationRequest(str(i), it.prompt_ids, greedy) for i, it in enumerate(dataset)]
    )
    score = load_custom_scorer(REWARD, "compute_score")
    totals = dict.fromkeys(SCORES, 0.0)
    for item, result in zip(dataset, results, strict=True):
        text = tokenizer.decode(result.response_ids, skip_special_tokens=True)
        for key, value in score(item.data_source, text, item.ground_truth, item.extra_info).items():
            totals[key] += value
    return {key: round(value / len(dataset), 4) for key, value in totals.items()} | {"n": len(dataset)}


def run_summary(run_dir: Path) -> dict[str, float]:
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]
    phases = sorted({k for r in train for k in r if k.startswith("timing_s/")})
    summary = {k: round(statistics.mean(r[k] for r in train if k in r), 2) for k in phases}
    summary["steps"] = len(train)
    summary["tokens_per_s"] = round(statistics.mean(r["perf/throughput"] for r in train), 1)
    summary["max_memory_allocated_gb"] = round(max(r["perf/max_memory_allocated_gb"] for r in train), 2)
    summary["train_score_first_last"] = [train[0]["critic/score/mean"], train[-1]["critic/score/mean"]]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=str(ROOT / ".models" / "SmolLM2-135M-Instruct"))
    parser.add_argument("--out", required=True, help="folder for the data and the run")
    parser.add_argument("--max-tokens", type=int, default=32, help="reply budget of the held-out scoring")
    parser.add_argument("--json", default=None)
    parser.add_argument("overrides", nargs="*", help="passed to stratarl train")
    args = parser.parse_args()
    out = Path(args.out)
    paths = make_task(out / "data")
    row: dict = {"model": args.model, "overrides": args.overrides, "threads": torch.get_num_threads()}
    start = time.perf_counter()
    row["before"] = held_out_scores(Path(args.model), paths["test"], args.max_tokens)
    row["eval_s"] = round(time.perf_counter() - start, 1)
    print("held out, untouched:", row["before"], flush=True)
    run_dir = out / "run"
    start = time.perf_counter()
    stratarl_main(
        ["train", str(RECIPE), f"model.path={args.model}", f"data.train_files=[{paths['train']}]",
         f"data.val_files=[{paths['test']}]", f"trainer.run_dir={run_dir}", *args.overrides]
    )  # fmt: skip
    row["train_s"] = round(time.perf_counter() - start, 1)
    row["after"] = held_out_scores(run_dir / "final", paths["test"], args.max_tokens)
    print("held out, after GRPO:", row["after"], flush=True)
    row["run"] = run_summary(run_dir)
    row["max_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2, 2)
    print(json.dumps(row, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=2) + "\n")


if __name__ == "__main__":
    main()
