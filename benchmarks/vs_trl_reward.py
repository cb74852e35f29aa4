"""Benchmark: reward after the same GRPO steps, stratarl against TRL's `GRPOTrainer`, both started
from the same SFT checkpoint (issue 19's "equal or better reward").

Per seed: `stratarl quickstart` (`run_quickstart`) builds the data, the tiny model and its SFT
warm-start and then runs its 50 GRPO steps; TRL then trains the same SFT checkpoint (RUN/sft/final)
on the same prompts with the same reward and knobs for the same number of steps. One evaluator —
HF `generate`, greedy, the prompts tokenized by `stratarl.data.prompt_dataset.tokenize_prompt`
(the chat template, as TRL applies it), `rollout.max_response_tokens` new tokens, the arithmetic
rule score — reads the held-out split with the SFT weights and with each side's final weights.
The quickstart's own step-50 validation is printed beside it as a cross-check.

Knobs on both sides (the quickstart's GRPO, printed by the script): 32 prompts × n = 8 per step,
natural response lengths (EOS allowed) up to 12 tokens, temperature 1, top-k/top-p off, one
optimizer step per batch (one mini-batch, one epoch; 4 micro-batches of 64 / TRL's gradient
accumulation 4 × 64), token-mean over the batch (TRL `loss_type="dapo"`), group-std-normalized
advantages, clip ε 0.2, β 0, AdamW lr 3e-4 constant, wd 0.01, betas (0.9, 0.999), grad clip 1,
fp32, 1 thread. Known differences: stratarl's dual clip (c = 3 on negative advantages) has no
TRL counterpart; TRL's seed drives its own sampling order.

    python benchmarks/vs_trl_reward.py --seeds 0,1 --json reward.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

STEPS, PROMPTS, N, T, LR = 50, 32, 8, 12, 3e-4
KNOBS = (
    f"{PROMPTS} prompts × n={N}, responses up to {T} tokens (EOS allowed), temperature 1, one update "
    f"per batch, token-mean, group-std advantages, clip ε=0.2, β=0, AdamW lr={LR} constant wd=0.01, "
    f"grad clip 1, fp32, 1 thread, {STEPS} steps from the quickstart's SFT checkpoint; stratarl's dual "
    "clip c=3 has no TRL counterpart"
)


def held_out_accuracy(model_dir: Path, test_file: Path) -> float:
    """Greedy accuracy on the held-out split: one evaluator for every side's weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stratarl.data.prompt_dataset import tokenize_prompt
    from stratarl.data.schema import read_rows
    from stratarl.reward.arithmetic import compute_score

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    correct = 0
    rows = read_rows(test_file)
    for row in rows:
        ids = torch.tensor([tokenize_prompt(tokenizer, row["prompt"])])
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=T,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        correct += compute_score("arithmetic", text, row["reward_model"]["ground_truth"])["score"]
    return correct / len(rows)


def run_stratarl(run_dir: Path, seed: int) -> dict:
    from stratarl.apps.quickstart import run_quickstart
    from stratarl.observe.run_log import read_metrics

    start = time.perf_counter()
    summary = run_quickstart(run_dir, seed=seed)
    train = [r for r in read_metrics(run_dir / "grpo" / "metrics.jsonl") if r["phase"] == "train"]
    return {
        "reward": [float(r["critic/score/mean"]) for r in train],
        "own_validation": summary["accuracy_after_grpo"],
        "after_sft_own_validation": summary["accuracy_after_sft"],
        "grpo_s": round(time.perf_counter() - start, 1),
    }


def run_trl(run_dir: Path, seed: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from vs_trl import trl_arithmetic_reward

    from stratarl.data.schema import read_rows

    sft = run_dir / "sft" / "final"
    rows = read_rows(run_dir / "data" / "train.parquet")
    dataset = Dataset.from_list(
        [{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows]
    )
    reward = trl_arithmetic_reward()
    args = GRPOConfig(
        output_dir=str(run_dir / "trl-out"), per_device_train_batch_size=64, gradient_accumulation_steps=4,
        num_generations=N, max_completion_length=T, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.01,
        adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, beta=0.0, epsilon=0.2, loss_type="dapo",
        scale_rewards="group", num_iterations=1, max_steps=STEPS, logging_steps=1, report_to=[],
        save_strategy="no", use_cpu=True, bf16=False, seed=seed, dataloader_num_workers=0,
        disable_dropout=True, gradient_checkpointing=False,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(sft)
    model = AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    rewards: list[float] = []

    class Rewards(TrainerCallback):
        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    trainer.add_callback(Rewards())
    start = time.perf_counter()
    trainer.train()
    elapsed = round(time.perf_counter() - start, 1)
    trainer.save_model(str(run_dir / "trl-final"))
    tokenizer.save_pretrained(run_dir / "trl-final")
    return {"reward": rewards, "grpo_s": elapsed}


def child(side: str, run_dir: Path, seed: int, out: Path) -> None:
    import torch

    torch.set_num_threads(1)
    result = run_stratarl(run_dir, seed) if side == "stratarl" else run_trl(run_dir, seed)
    final = run_dir / ("grpo/final" if side == "stratarl" else "trl-final")
    test = run_dir / "data" / "test.parquet"
    result["held_out"] = held_out_accuracy(final, test)
    if side == "stratarl":
        result["held_out_sft"] = held_out_accuracy(run_dir / "sft" / "final", test)
    out.write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)  # side run_dir seed
    args = parser.parse_args()
    if args.child:
        side, run_dir, seed = args.child
        return child(side, Path(run_dir), int(seed), Path(run_dir) / f"{side}.json")
    import tempfile

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="vs-trl-reward-"))
    print(f"knobs: {KNOBS}")
    results = {"knobs": KNOBS, "seeds": {}}
    for seed in (int(s) for s in args.seeds.split(",")):
        run_dir = workdir / f"seed{seed}"
        for side in ("stratarl", "trl"):  # stratarl first: its quickstart writes the SFT checkpoint
            command = [sys.executable, __file__, "--child", side, str(run_dir), str(seed)]
            run_dir.mkdir(parents=True, exist_ok=True)
            with (workdir / f"seed{seed}-{side}.log").open("w") as log:
                done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
            if done.returncode:
                raise SystemExit(f"{side}, seed {seed}: exit {done.returncode}; see {log.name}")
        s, t = (json.loads((run_dir / f"{side}.json").read_text()) for side in ("stratarl", "trl"))
        results["seeds"][seed] = {"stratarl": s, "trl": t}
        first, last = slice(0, 5), slice(-5, None)
        print(
            f"seed {seed}: held-out after SFT {s['held_out_sft']:.3f}; after {STEPS} steps stratarl "
            f"{s['held_out']:.3f} (its own validation {s['own_validation']:.3f}), TRL {t['held_out']:.3f}; "
            f"train reward steps 1-5 → last 5: stratarl {statistics.mean(s['reward'][first]):.3f} → "
            f"{statistics.mean(s['reward'][last]):.3f}, TRL {statistics.mean(t['reward'][first]):.3f} → "
            f"{statistics.mean(t['reward'][last]):.3f}; GRPO wall s: stratarl {s['grpo_s']} (with SFT), "
            f"TRL {t['grpo_s']}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
