"""Layer 2, control flow: supervised warm-start (SFT) on the same prompt datasets.

Each example is a prompt (chat-templated, left-padded) followed by its reference response
(`extra_info["answer"]`, verl's SFT convention) and EOS, right-padded: the same layout as an RL
batch, so the same worker and engine train it. The loss is the token-mean negative log-likelihood
of the response tokens only:  L = −Σ_t m_t log π(y_t | x, y_<t) / Σ_t m_t.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from stratarl.algo.aggregation import aggregate_loss
from stratarl.cluster.policy_worker import PolicyWorker
from stratarl.config import RunConfig, save_resolved_config
from stratarl.data.prompt_dataset import PromptDataset, PromptItem
from stratarl.data.sampler import PromptSampler
from stratarl.observe.loggers import make_sinks
from stratarl.observe.run_log import RunLog
from stratarl.trainer import builders
from stratarl.trainer.validation import evaluate_accuracy
from stratarl.transport.batch_edge import lay_out_batch_edge
from stratarl.transport.data_proto import DataProto

MODEL_COLUMNS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


def sft_loss(micro: DataProto, scores, totals) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean NLL over the mini-batch (micro-batch losses add up to it)."""
    loss = aggregate_loss(
        -scores.log_prob, micro["response_mask"], "token-mean", global_num_tokens=totals.num_tokens
    )
    return loss, {"sft/loss": loss.item()}


sft_loss.needs_entropy = False  # type: ignore[attr-defined]


def reference_response(item: Any) -> str:
    answer = (item.extra_info or {}).get("answer")
    if not isinstance(answer, str) or not answer:
        raise ValueError(
            f"{item.source_file} row {item.source_row}: SFT needs extra_info['answer'] (reference)"
        )
    return answer


def sft_batch(dataset: PromptDataset, indices: list[int], tokenizer: Any) -> DataProto:
    """Prompt ++ reference response ++ EOS, in the batch-edge layout."""
    items = [dataset[i] for i in indices]
    eos = tokenizer.eos_token_id
    targets = [[*tokenizer.encode(reference_response(it), add_special_tokens=False), eos] for it in items]
    return sft_examples(items, targets, tokenizer.pad_token_id)


def sft_examples(
    items: Sequence[PromptItem], targets: list[list[int]], pad_token_id: int, *, masks: list | None = None
) -> DataProto:
    """Each item's prompt ++ its target ids, in the batch-edge layout at the batch's widths; `masks`
    (per target token, 1 = trained) become response_mask, all ones by default."""
    prompt_ids = [list(it.prompt_ids) for it in items]
    columns = lay_out_batch_edge(
        prompt_ids,
        targets,
        pad_token_id=pad_token_id,
        prompt_len=max(len(p) for p in prompt_ids),
        response_len=max(len(t) for t in targets),
        action_mask=masks,
    )
    return DataProto.from_dict({k: columns[k] for k in MODEL_COLUMNS})


def sft_worker(cfg: RunConfig, tokenizer: Any, total_steps: int) -> PolicyWorker:
    s = cfg.sft
    return PolicyWorker(
        model_path=cfg.model.path,
        eos_token_ids=builders.eos_token_ids(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        dtype=cfg.model.dtype,
        rollout_seed=cfg.trainer.seed,
        actor_kwargs={
            "lr": s.lr,
            "micro_batch_size": s.trajectories_per_micro_batch,
            "weight_decay": s.weight_decay,
            "grad_clip": s.grad_clip,
            "lr_schedule": s.lr_schedule,
            "warmup_steps": s.warmup_steps,
            "total_steps": total_steps,
            "min_lr_ratio": s.min_lr_ratio,
        },
    )


def run_sft(
    worker: PolicyWorker,
    dataset: PromptDataset,
    tokenizer: Any,
    *,
    examples_per_step: int,
    total_steps: int,
    seed: int,
    log: RunLog,
    log_every: int = 10,
    make_batch: Callable[[PromptDataset, list[int], Any], DataProto] | None = None,
) -> dict[str, float]:
    """`total_steps` optimizer steps of SFT; the rollout engine is synced at the end. `make_batch`
    lays out the examples (default `sft_batch`; multi-turn: `agent_sft.agent_sft_batch`)."""
    sampler = PromptSampler(len(dataset), batch_size=examples_per_step, seed=seed)
    metrics: dict[str, float] = {}
    for step in range(1, total_steps + 1):
        batch = (make_batch or sft_batch)(dataset, sampler.next_batch(), tokenizer)
        metrics = worker.update_actor(batch, sft_loss, mini_batch_size=len(batch))
        metrics = {k if k.startswith("sft/") else f"sft/{k}": v for k, v in metrics.items()}
        log.log_metrics(step, metrics, phase="sft")
        if step % log_every == 0 or step == total_steps:
            log.console.print(f"[bold]sft step {step}/{total_steps}[/bold]  loss={metrics['sft/loss']:.4f}")
    worker.sync_weights()
    return metrics


def sft_from_config(cfg: RunConfig, run_dir: str | Path) -> dict[str, float]:
    """`stratarl sft`: SFT on data.train_files with the `sft` settings; greedy accuracy on
    data.val_files before and after; the result saved HF-loadable in run_dir/final."""

    run_dir, t = Path(run_dir), cfg.trainer
    log = RunLog(run_dir)
    log.attach(
        make_sinks(
            t.logger, run_dir, project=t.project_name, experiment=t.experiment_name, config=asdict(cfg)
        )
    )
    try:
        return _sft_run(cfg, run_dir, log)
    finally:
        log.close()


def _sft_run(cfg: RunConfig, run_dir: Path, log: RunLog) -> dict[str, float]:
    save_resolved_config(cfg, run_dir)
    tokenizer = builders.load_tokenizer(cfg)
    d = cfg.data
    train_set = builders.load_prompts(
        d.train_files,
        tokenizer,
        max_prompt_tokens=d.max_prompt_tokens,
        limit=None,
        **builders.data_columns(cfg),
    )
    steps = cfg.sft.total_steps or cfg.sft.total_epochs * max(
        1, len(train_set) // cfg.sft.trajectories_per_step
    )
    worker = sft_worker(cfg, tokenizer, steps)

    def accuracy(step: int) -> float:
        if not d.val_files:
            return float("nan")
        val_set = builders.load_prompts(
            d.val_files,
            tokenizer,
            max_prompt_tokens=d.max_prompt_tokens,
            limit=None,
            **builders.data_columns(cfg),
        )
        value, metrics = evaluate_accuracy(worker, cfg, tokenizer, val_set, step)
        log.log_metrics(step, metrics, phase="val")
        return value

    before = accuracy(0)
    run_sft(
        worker, train_set, tokenizer, examples_per_step=cfg.sft.trajectories_per_step, total_steps=steps,
        seed=cfg.trainer.seed, log=log,
    )  # fmt: skip
    after = accuracy(steps)
    worker.save_pretrained(run_dir / "final")
    tokenizer.save_pretrained(run_dir / "final")
    summary = {"accuracy_before": before, "accuracy_after": after, "steps": float(steps)}
    log.print_table("sft summary", summary | {"weights": str(run_dir / "final")})
    return summary
