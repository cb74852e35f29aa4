"""Application: the tool quickstart — a tiny model learns to use a calculator, on a laptop CPU.

1. write the tool task (`a*b` with 3-digit operands; training demonstrations call the calculator on
   a `tool_fraction` of the rows and answer directly on the rest) and its tools.yaml;
2. train a tokenizer on it and initialise a tiny Qwen2 model (no hub access);
3. SFT warm-start on the multi-turn demonstrations (tool results masked out of the loss), until
   the model copies the tool's result (`sft_until_copying`, capped by sft.total_steps);
4. GRPO from the SFT checkpoint with the tool loop in the rollout (`agent.enable`);
5. held-out accuracy, tool-call success rate and tool use, greedy and sampled, after SFT and after
   GRPO -> summary.json (measured: docs/benchmarks.md ("Tool quickstart")).

A direct answer to a 3-digit product is almost never right for a 1M-parameter model, a tool call
whose result is copied is: GRPO's reward teaches the model to call the tool, and to call it well.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from stratarl.apps.quickstart import (
    grpo_from_sft,
    load_splits,
    save_sft_checkpoint,
    sft_step_budget,
    tiny_model_for,
)
from stratarl.assembly import algorithm, datasets, scoring
from stratarl.config import RunConfig, ValidationSamplingConfig, load_config
from stratarl.data.tasks.tool_arithmetic import make_tool_dataset
from stratarl.observe.run_log import RunLog, write_atomically
from stratarl.trainer.agent_rollout import build_agent_rollout
from stratarl.trainer.agent_sft import agent_sft_batch
from stratarl.trainer.agent_validation import TOOL_SUCCESS_KEY, run_agent_validation
from stratarl.trainer.rl_trainer import RLTrainer
from stratarl.trainer.sft import run_sft, sft_worker
from stratarl.trainer.validation import overall_accuracy

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tool_quickstart.yaml"
USED_TOOL_KEY = "val-aux/agent/used_tool/fraction"


def sampled_eval_settings(greedy: ValidationSamplingConfig) -> ValidationSamplingConfig:
    """The second evaluation: 4 samples per held-out problem at temperature 1 (the training policy
    as it acts; greedy decoding hides the malformed calls and direct answers it still makes)."""
    return dataclasses.replace(greedy, greedy=False, temperature=1.0, top_p=1.0, top_k=-1, n=4)


@dataclasses.dataclass(frozen=True)
class ToolTaskSettings:
    """What the tool quickstart builds before training (not part of the run config)."""

    model_size: str = "1m"
    # 8000 distinct problems: with 1000 the model memorised training products instead of learning
    # to copy the tool's result, and stayed on the loss plateau past 500 SFT steps.
    n_train: int = 8000
    n_test: int = 200
    digits: tuple[int, int] = (3, 3)
    # Share of the SFT demonstrations that call the tool; the rest answer at once (and are wrong:
    # a 1M model cannot multiply 3-digit numbers). At 0.5 the model learned to copy the tool's
    # result far more slowly (no correct greedy answer after 300 steps of 64 examples).
    tool_fraction: float = 0.75
    # No system message: the demonstrations teach the format, and a short prompt keeps the operands
    # close to where the model copies them into the call.
    with_instruction: bool = False
    # SFT stops early once the mean loss of a round of `sft_check_every` steps is below this
    # (`sft_until_copying`); None: exactly sft.total_steps.
    sft_loss_target: float | None = 0.18
    sft_check_every: int = 50


def build_tool_task(run_dir: Path, task: ToolTaskSettings, seed: int) -> tuple[dict[str, Path], Path]:
    paths = make_tool_dataset(
        run_dir / "data",
        n_train=task.n_train,
        n_test=task.n_test,
        digits=task.digits,
        tool_fraction=task.tool_fraction,
        with_instruction=task.with_instruction,
        seed=seed,
    )
    return paths, tiny_model_for(run_dir, paths["train"], size=task.model_size, seed=seed)


def evaluate_agent(
    worker: Any, cfg: RunConfig, tokenizer: Any, dataset: Any, step: int
) -> dict[str, float | None]:
    """Held-out episodes, greedy (`rollout.val_kwargs`) and sampled (`sampled_eval_settings`): accuracy,
    tool-call success rate (attempted calls that ran without error) and the share of episodes that
    used the tool, as `<metric>_greedy` / `<metric>_sampled`."""
    compute_score = scoring.build_compute_score(cfg)
    agent = build_agent_rollout(cfg, tokenizer)
    assert agent is not None, "the tool quickstart needs agent.enable=true"
    sampled_kwargs = sampled_eval_settings(cfg.rollout.val_kwargs)
    sampled = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, val_kwargs=sampled_kwargs))
    out: dict[str, float | None] = {}
    try:
        for name, eval_cfg in (("greedy", cfg), ("sampled", sampled)):
            n = eval_cfg.rollout.val_kwargs.n
            metrics, _ = run_agent_validation(
                agent,
                worker,
                dataset,
                tokenizer=tokenizer,
                compute_score=compute_score,
                sampling=algorithm.val_sampling(eval_cfg),
                n=n,
                step=step,
                seed=cfg.trainer.seed,
            )
            out[f"accuracy_{name}"] = overall_accuracy(metrics, n)
            out[f"tool_call_success_rate_{name}"] = metrics.get(TOOL_SUCCESS_KEY)  # None: none attempted
            out[f"used_tool_fraction_{name}"] = metrics.get(USED_TOOL_KEY, 0.0)
    finally:
        agent.close()  # its tool workers
    return out


def sft_until_copying(
    worker: Any, dataset: Any, tokenizer: Any, cfg: RunConfig, task: ToolTaskSettings, *, seed: int,
    log: RunLog, max_steps: int,
) -> int:  # fmt: skip
    """SFT in rounds of `task.sft_check_every` steps until the mean loss of a round is below
    `task.sft_loss_target` (the model copies the tool's result) or `max_steps`; returns the steps run.

    The loss first falls to a plateau (format learned, digits guessed: ~0.75 per token), drops to
    ~0.35 when the model copies the operands into the call, and to ~0.15 when it copies the result
    into its answer. When those drops come varies with the seed by hundreds of steps, so a fixed
    budget either wastes time or stops before the copy, where GRPO gets no reward to learn from."""
    done = 0
    while done < max_steps:
        steps = min(task.sft_check_every, max_steps - done)
        run_sft(
            worker, dataset, tokenizer, examples_per_step=cfg.sft.trajectories_per_step, total_steps=steps,
            seed=seed * 1_000 + done, log=log, log_every=steps, make_batch=agent_sft_batch,
            max_tokens=cfg.sft.max_tokens,
        )  # fmt: skip
        done += steps
        losses = [r["sft/loss"] for r in log.history[-steps:]]
        if task.sft_loss_target is not None and sum(losses) / len(losses) < task.sft_loss_target:
            break
    return done


def run_tool_quickstart(
    run_dir: str | Path,
    *,
    seed: int = 0,
    overrides: list[str] | None = None,
    task: ToolTaskSettings | None = None,
) -> dict[str, Any]:
    """Everything above; returns the summary (also written to run_dir/summary.json)."""
    task = task or ToolTaskSettings()
    run_dir, console, start = Path(run_dir), Console(), time.perf_counter()
    datasets.seed_everything(seed)
    console.rule("[bold]stratarl quickstart --task tool[/bold]: data, tools.yaml and tiny model")
    paths, model_dir = build_tool_task(run_dir, task, seed)
    base = [
        f"data.train_files=['{paths['train']}']",
        f"data.val_files=['{paths['test']}']",
        f"agent.tool_config_path={paths['tools']}",
        f"model.path={model_dir}",
        f"trainer.seed={seed}",
    ]
    cfg = load_config(RECIPE, [*base, *(overrides or [])])
    tokenizer = datasets.load_tokenizer(cfg)
    train_set, val_set = load_splits(cfg, tokenizer)

    console.rule("SFT warm-start on multi-turn demonstrations")
    max_steps = sft_step_budget(cfg, train_set)
    worker = sft_worker(cfg, tokenizer, max_steps)
    sft_start = time.perf_counter()
    sft_log = RunLog(run_dir / "sft", console=console)
    sft_steps = sft_until_copying(
        worker, train_set, tokenizer, cfg, task, seed=seed, log=sft_log, max_steps=max_steps
    )
    sft_seconds = time.perf_counter() - sft_start
    after_sft = evaluate_agent(worker, cfg, tokenizer, val_set, step=sft_steps)
    console.print(f"[bold cyan]after SFT[/bold cyan] {after_sft}")
    sft_dir = save_sft_checkpoint(worker, tokenizer, run_dir)
    del worker

    console.rule("GRPO with the tool loop")
    grpo_start = time.perf_counter()
    trainer = RLTrainer(grpo_from_sft(cfg, sft_dir), run_dir / "grpo", console=console)
    trainer.fit()
    grpo_seconds = time.perf_counter() - grpo_start
    after_grpo = evaluate_agent(trainer.worker, cfg, tokenizer, val_set, step=trainer.total_steps)

    summary: dict[str, Any] = {f"{k}_after_sft": v for k, v in after_sft.items()}
    summary |= {f"{k}_after_grpo": v for k, v in after_grpo.items()}
    summary |= {
        "sft_steps": sft_steps,
        "grpo_steps": cfg.trainer.total_steps,
        "sft_time_s": round(sft_seconds, 1),
        "grpo_time_s": round(grpo_seconds, 1),
        "wall_time_s": round(time.perf_counter() - start, 1),
        "seed": seed,
        "run_dir": str(run_dir),
    }
    write_atomically(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    RunLog(run_dir, console=console).print_table("tool quickstart summary", summary)
    return summary
