"""Benchmark: on-policy distillation from a stronger teacher against GRPO alone, at the same steps.

The quickstart's task (single-digit + and −, 160 training and 40 held-out problems, a byte-level BPE
tokenizer and 1M Qwen2 models built locally, one compute thread).

- **Teacher**: the quickstart run on seed `--teacher-seed` (`run_quickstart`: SFT then GRPO), with a
  longer SFT than the quickstart's (`--teacher-sft-steps`, cosine schedule) so that it is clearly
  stronger than the students; built once and cached in `--work` (its `grpo/final` is the teacher).
- **Student**, for each `--seeds` s: a fresh model of `--student-size` initialised from seed s, with
  the teacher's tokenizer (so the teacher scores the student's token ids), SFT'd for a short
  `--student-sft-steps` on the teacher's training split (the quickstart's SFT, `warm_start`); then
  from that one checkpoint, `--steps` N steps of each arm through the trainer the quickstart and
  `stratarl train` use (`RLTrainer`, the same prompts per step and samples per prompt):
    - `grpo`: recipes/grpo_arithmetic.yaml (the quickstart's GRPO): the baseline;
    - `distill`: recipes/distill_arithmetic.yaml with `distillation.use_task_rewards=false`: the
      reverse-KL loss (`--loss-mode`, k3 by default) on the student's own samples, no task reward;
    - `grpo+distill`: the same with `use_task_rewards=true`: L = L_grpo + coef · L_distill.

Reported per seed and arm: held-out greedy accuracy after SFT and after the N steps, the gain, and
the median seconds per step (`timing_s/step`, steps 2..N-1: the first pays the warm-up, the last the
validation) with its `timing_s/teacher` part; then the means over seeds, each arm's gain and step
time against GRPO's measured in the same run.

    OMP_NUM_THREADS=1 python benchmarks/distillation.py --seeds 0 1 2 --json out.json
    OMP_NUM_THREADS=1 python benchmarks/distillation.py actor.lr=1e-3 --seeds 0   # every arm's LR
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = {  # name: (recipe, overrides beside the run's)
    "grpo": ("grpo_arithmetic.yaml", []),
    "distill": ("distill_arithmetic.yaml", ["distillation.use_task_rewards=false"]),
    "grpo+distill": ("distill_arithmetic.yaml", ["distillation.use_task_rewards=true"]),
}


def build_teacher(work: Path, args: argparse.Namespace) -> dict:
    """The quickstart on the teacher seed with the longer SFT; cached by its settings."""
    from stratarl.apps.quickstart import TaskSettings, run_quickstart

    name = f"teacher-s{args.teacher_seed}-sft{args.teacher_sft_steps}-grpo{args.teacher_grpo_steps}"
    run_dir = work / name
    if not (run_dir / "summary.json").exists():
        overrides = [
            f"sft.total_steps={args.teacher_sft_steps}",
            "sft.lr_schedule=cosine",
            f"trainer.total_steps={args.teacher_grpo_steps}",
            f"trainer.test_freq={args.teacher_grpo_steps}",
        ]
        if run_dir.exists():  # an interrupted build: start it again from nothing
            raise SystemExit(f"{run_dir} holds an unfinished teacher build: remove it and run again")
        run_quickstart(
            run_dir, seed=args.teacher_seed, overrides=overrides, task=TaskSettings(threads=args.threads)
        )
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary | {
        "model": str(run_dir / "grpo" / "final"),
        "tokenizer": str(run_dir / "model"),
        "train": str(run_dir / "data" / "train.parquet"),
        "test": str(run_dir / "data" / "test.parquet"),
    }


def student_checkpoint(root: Path, teacher: dict, seed: int, args: argparse.Namespace) -> dict:
    """A fresh student with the teacher's tokenizer, SFT'd for --student-sft-steps (the quickstart's SFT)."""
    from rich.console import Console
    from transformers import AutoTokenizer

    from stratarl.apps.quickstart import RECIPE, warm_start
    from stratarl.assembly import datasets
    from stratarl.config import load_config
    from stratarl.data.tiny_models import save_tiny_model, tiny_model_config

    tokenizer = AutoTokenizer.from_pretrained(teacher["tokenizer"])
    config = tiny_model_config(size=args.student_size, tokenizer=tokenizer)
    init = save_tiny_model(root / "init", config=config, tokenizer=tokenizer, seed=seed)
    overrides = [*data_overrides(teacher), f"model.path={init}", f"trainer.seed={seed}"]
    cfg = load_config(RECIPE, [*overrides, f"sft.total_steps={args.student_sft_steps}"])
    datasets.seed_everything(seed)
    before, after, sft_dir = warm_start(cfg, root, console=Console(), seed=seed)
    return {"accuracy_init": before, "accuracy_sft": after, "sft_dir": str(sft_dir)}


def data_overrides(teacher: dict) -> list[str]:
    return [f"data.train_files=['{teacher['train']}']", f"data.val_files=['{teacher['test']}']"]


def run_arm(root: Path, arm: str, teacher: dict, sft_dir: str, seed: int, args: argparse.Namespace) -> dict:
    """N steps of one arm from the student's SFT checkpoint; held-out accuracy at step N."""
    from rich.console import Console

    from stratarl.config import load_config, validate_config
    from stratarl.trainer.rl_trainer import RLTrainer
    from stratarl.trainer.validation import overall_accuracy

    recipe, extra = ARMS[arm]
    overrides = [
        *data_overrides(teacher),
        f"model.path={sft_dir}",
        f"trainer.seed={seed}",
        f"trainer.total_steps={args.steps}",
        f"trainer.test_freq={args.steps}",
        "trainer.val_before_train=false",  # the SFT checkpoint's accuracy is measured once, above
        f"distillation.teacher_model_path={teacher['model']}",
        f"distillation.loss_mode={args.loss_mode}",
        f"distillation.distillation_loss_coef={args.coef}",
        *extra,
        *args.overrides,
    ]
    if arm == "grpo":  # grpo_arithmetic.yaml has distillation off: no teacher settings
        overrides = [o for o in overrides if not o.startswith("distillation.")]
    cfg = load_config(REPO / "recipes" / recipe, overrides)
    validate_config(cfg)
    run_dir = root / arm
    start = time.perf_counter()
    last_val = RLTrainer(cfg, run_dir, console=Console()).fit()
    wall = time.perf_counter() - start
    train = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if json.loads(line).get("phase") == "train"
    ]
    timed = train[1:-1] or train  # step 1 warms up, step N also validates
    return {
        "accuracy": overall_accuracy(last_val, cfg.rollout.val_kwargs.n),
        "s_per_step": statistics.median(m["timing_s/step"] for m in timed),
        "teacher_s_per_step": statistics.median(m.get("timing_s/teacher", 0.0) for m in timed),
        "train_reward_last": train[-1].get("critic/score/mean"),
        "wall_s": wall,
    }


def pct(x: float) -> str:
    return f"{100 * x:5.1f} %"


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30, help="RL steps of every arm")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--teacher-seed", type=int, default=0)
    parser.add_argument("--teacher-sft-steps", type=int, default=300)
    parser.add_argument("--teacher-grpo-steps", type=int, default=50)
    parser.add_argument("--student-size", default="1m", help="tiny model preset of the students")
    parser.add_argument("--student-sft-steps", type=int, default=60)
    parser.add_argument("--loss-mode", default="k3", help="distillation.loss_mode of the distillation arms")
    parser.add_argument("--coef", type=float, default=1.0, help="distillation.distillation_loss_coef")
    parser.add_argument("--threads", type=int, default=1, help="torch compute threads (the quickstart's: 1)")
    parser.add_argument("--work", default=None, help="cache directory for the teacher (default: a temp dir)")
    parser.add_argument("--json", default=None, help="write the numbers to this path")
    parser.add_argument("overrides", nargs="*", help="overrides of every arm's run, e.g. actor.lr=1e-3")
    args = parser.parse_args()
    if "grpo" not in args.arms:
        parser.error("--arms must include grpo: it is the baseline")

    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="srl-bench-distill-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        teacher = build_teacher(work, args)
        results: dict[str, dict] = {}
        runs = Path(tempfile.mkdtemp(prefix="runs-", dir=work))
        for seed in args.seeds:
            student = student_checkpoint(runs / f"seed{seed}", teacher, seed, args)
            arms = {arm: run_arm(runs / f"seed{seed}", arm, teacher, student["sft_dir"], seed, args)
                    for arm in args.arms}  # fmt: skip
            results[str(seed)] = student | {"arms": arms}
            done = [f"{k} {pct(a['accuracy'])} {a['s_per_step']:.3f} s/step" for k, a in arms.items()]
            print(f"seed {seed}: after SFT {pct(student['accuracy_sft'])}; {', '.join(done)}", flush=True)
            if args.json:  # so far, in case a later seed fails
                Path(args.json).write_text(json.dumps({"partial": True, "seeds": results}, indent=2) + "\n")
    report(teacher, results, args)


def report(teacher: dict, results: dict[str, dict], args: argparse.Namespace) -> None:
    print(f"\nteacher (quickstart seed {args.teacher_seed}, SFT {args.teacher_sft_steps} cosine + GRPO "
          f"{args.teacher_grpo_steps}): held-out {pct(teacher['accuracy_after_sft'])} after SFT, "
          f"{pct(teacher['accuracy_after_grpo'])} after GRPO")  # fmt: skip
    print(f"students: {args.student_size}, SFT {args.student_sft_steps} steps; every arm {args.steps} steps "
          f"from the same checkpoint; loss_mode={args.loss_mode}, coef {args.coef}; "
          f"overrides {args.overrides or 'none'}\n")  # fmt: skip
    print(f"{'seed':>4} {'arm':13s} {'after SFT':>9s} {'after RL':>9s} {'gain':>7s} {'s/step':>7s} "
          f"{'teacher s':>9s}")  # fmt: skip
    for seed, r in results.items():
        for arm, a in r["arms"].items():
            print(f"{seed:>4} {arm:13s} {pct(r['accuracy_sft']):>9s} {pct(a['accuracy']):>9s} "
                  f"{100 * (a['accuracy'] - r['accuracy_sft']):+6.1f} {a['s_per_step']:7.3f} "
                  f"{a['teacher_s_per_step']:9.3f}")  # fmt: skip
    means: dict[str, dict] = {}
    for arm in args.arms:
        rows = [(r["accuracy_sft"], r["arms"][arm]) for r in results.values()]
        means[arm] = {
            "accuracy_sft": statistics.mean(s for s, _ in rows),
            "accuracy": statistics.mean(a["accuracy"] for _, a in rows),
            "gain": statistics.mean(a["accuracy"] - s for s, a in rows),
            "s_per_step": statistics.mean(a["s_per_step"] for _, a in rows),
            "teacher_s_per_step": statistics.mean(a["teacher_s_per_step"] for _, a in rows),
        }
    base = means["grpo"]
    print(f"\nmean over seeds {' '.join(results)}:")
    for arm, m in means.items():
        m["step_time_vs_grpo"] = m["s_per_step"] / base["s_per_step"]
        m["accuracy_minus_grpo"] = m["accuracy"] - base["accuracy"]
        print(f"  {arm:13s} {pct(m['accuracy_sft'])} → {pct(m['accuracy'])} (gain {100 * m['gain']:+.1f}, "
              f"{100 * m['accuracy_minus_grpo']:+.1f} vs GRPO)  {m['s_per_step']:.3f} s/step "
              f"(×{m['step_time_vs_grpo']:.2f} GRPO's; teacher {m['teacher_s_per_step']:.3f} s)")  # fmt: skip
    if args.json:
        config = {k: v for k, v in vars(args).items() if k != "json"}
        keys = ("accuracy_before_sft", "accuracy_after_sft", "accuracy_after_grpo")
        teacher_out = {k: teacher[k] for k in keys}
        out = {"config": config, "teacher": teacher_out, "seeds": results, "mean": means}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
