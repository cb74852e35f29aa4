"""Application: the quickstart — from nothing to a measurably better model, on a laptop CPU.

1. write the arithmetic task as verl-schema parquet (train and held-out test splits);
2. train a byte-level BPE tokenizer on it and initialise a tiny Qwen2 model (no hub access);
3. SFT warm-start for a short budget;
4. GRPO from the SFT checkpoint;
5. greedy accuracy on the held-out split before SFT, after SFT and after GRPO -> summary.json.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from stratarl.assembly import datasets, preflight
from stratarl.config import RunConfig, load_config
from stratarl.data.tasks.arithmetic import make_arithmetic_dataset
from stratarl.data.tiny_models import build_tiny_model
from stratarl.data.tokenizer_factory import corpus_from_parquet
from stratarl.observe.run_log import RunLog, write_atomically
from stratarl.trainer.rl_trainer import RLTrainer
from stratarl.trainer.sft import run_sft, sft_worker
from stratarl.trainer.validation import evaluate_accuracy, overall_accuracy

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"


@dataclasses.dataclass(frozen=True)
class TaskSettings:
    """What the quickstart builds before training (not part of the run config)."""

    model_size: str = "1m"
    # Single-digit + and −: 200 distinct problems, 40 held out. A 1M-parameter model learns them in
    # a few hundred SFT steps, so a short SFT leaves a gap that GRPO closes within minutes on 2 CPUs.
    n_train: int = 160
    n_test: int = 40
    digits: tuple[int, int] = (1, 1)
    operators: str = "+-"
    # One compute thread: a 1M model's matmuls gain little from a second core, and the float
    # reduction order (hence every sampled token) then no longer depends on the machine's core
    # count, so the numbers in docs/benchmarks.md reproduce on any machine of the same CPU type.
    threads: int = 1


def build_task(run_dir: Path, task: TaskSettings, seed: int) -> tuple[dict[str, Path], Path]:
    paths = make_arithmetic_dataset(
        run_dir / "data",
        n_train=task.n_train,
        n_test=task.n_test,
        digits=task.digits,
        operators=task.operators,
        seed=seed,
    )
    return paths, tiny_model_for(run_dir, paths["train"], size=task.model_size, seed=seed)


def tiny_model_for(run_dir: Path, train_path: Path, *, size: str, seed: int) -> Path:
    """A tiny model (run_dir/model) whose tokenizer is trained on the training split's texts."""
    corpus = corpus_from_parquet([train_path])
    return build_tiny_model(run_dir / "model", size=size, corpus_texts=corpus, seed=seed)


def load_splits(cfg: RunConfig, tokenizer: Any) -> tuple[Any, Any]:
    """(train, held-out) prompts of the run's data files; the held-out ones capped by
    data.max_val_prompts."""
    d, columns = cfg.data, datasets.data_columns(cfg)
    val_set = datasets.load_prompts(
        d.val_files, tokenizer, max_prompt_tokens=d.max_prompt_tokens, limit=d.max_val_prompts, **columns
    )
    train_set = datasets.load_prompts(
        d.train_files, tokenizer, max_prompt_tokens=d.max_prompt_tokens, limit=None, **columns
    )
    return train_set, val_set


def sft_step_budget(cfg: RunConfig, train_set: Any) -> int:
    """sft.total_steps, or sft.total_epochs passes over the training prompts."""
    per_epoch = max(1, len(train_set) // cfg.sft.trajectories_per_step)
    return cfg.sft.total_steps or cfg.sft.total_epochs * per_epoch


def save_sft_checkpoint(worker: Any, tokenizer: Any, run_dir: Path) -> Path:
    """The SFT model and its tokenizer as an HF directory, run_dir/sft/final: GRPO starts there."""
    sft_dir = worker.save_pretrained(run_dir / "sft" / "final")
    tokenizer.save_pretrained(sft_dir)
    return sft_dir


def grpo_from_sft(cfg: RunConfig, sft_dir: Path) -> RunConfig:
    """The GRPO run from the SFT weights; its step-0 validation would repeat the SFT number: skipped."""
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, path=str(sft_dir), tokenizer_path=""),
        trainer=dataclasses.replace(cfg.trainer, val_before_train=False),
    )


def warm_start(cfg: RunConfig, run_dir: Path, *, console: Console, seed: int) -> tuple[float, float, Path]:
    """SFT of model.path on the training split's demonstrations (run_dir/sft); returns held-out greedy
    accuracy before and after it, and the checkpoint's directory (run_dir/sft/final)."""
    tokenizer = datasets.load_tokenizer(cfg)
    train_set, val_set = load_splits(cfg, tokenizer)
    preflight.check_sft_lengths(train_set, tokenizer, cfg.sft.max_tokens)
    sft_steps = sft_step_budget(cfg, train_set)
    worker = sft_worker(cfg, tokenizer, sft_steps)
    accuracy_before, _, _ = evaluate_accuracy(worker, cfg, tokenizer, val_set, step=0)
    run_sft(
        worker,
        train_set,
        tokenizer,
        examples_per_step=cfg.sft.trajectories_per_step,
        total_steps=sft_steps,
        max_tokens=cfg.sft.max_tokens,
        seed=seed,
        log=RunLog(run_dir / "sft", console=console),
    )
    accuracy_after, _, _ = evaluate_accuracy(worker, cfg, tokenizer, val_set, step=sft_steps)
    sft_dir = save_sft_checkpoint(worker, tokenizer, run_dir)
    del worker
    return accuracy_before, accuracy_after, sft_dir


def run_quickstart(
    run_dir: str | Path,
    *,
    seed: int = 0,
    overrides: list[str] | None = None,
    task: TaskSettings | None = None,
) -> dict[str, Any]:
    """Everything above; returns the summary (also written to run_dir/summary.json)."""
    task = task or TaskSettings()
    run_dir, console, start = Path(run_dir), Console(), time.perf_counter()
    datasets.seed_everything(seed)
    torch.set_num_threads(task.threads)
    console.rule("[bold]stratarl quickstart[/bold]: data and tiny model")
    paths, model_dir = build_task(run_dir, task, seed)
    base = [
        f"data.train_files=['{paths['train']}']",
        f"data.val_files=['{paths['test']}']",
        f"model.path={model_dir}",
        f"trainer.seed={seed}",
    ]
    cfg = load_config(RECIPE, [*base, *(overrides or [])])

    console.rule("SFT warm-start")
    accuracy_before_sft, accuracy_after_sft, sft_dir = warm_start(cfg, run_dir, console=console, seed=seed)

    console.rule("GRPO")
    trainer = RLTrainer(grpo_from_sft(cfg, sft_dir), run_dir / "grpo", console=console)
    last_val = trainer.fit()
    accuracy_after_grpo = overall_accuracy(last_val, cfg.rollout.val_kwargs.n)

    summary = {
        "accuracy_before_sft": accuracy_before_sft,
        "accuracy_after_sft": accuracy_after_sft,
        "accuracy_after_grpo": accuracy_after_grpo,
        "wall_time_s": round(time.perf_counter() - start, 1),
        "seed": seed,
        "run_dir": str(run_dir),
    }
    write_atomically(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    RunLog(run_dir, console=console).print_table("quickstart summary", summary)
    return summary
