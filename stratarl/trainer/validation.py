"""Layer 2, control flow: validation — generate on held-out prompts, score, summarise per data source.

Metric names follow verl: `val-core/<data_source>/<var>/<metric>` for the core variable (`acc` when
the scorer reports it, else `reward`) at the largest k (mean@k, maj@k, best@k), everything else
under `val-aux/`. Greedy decoding by default (`rollout.val_kwargs`). Responses that stopped at
rollout.max_response_tokens instead of EOS are counted (`val-aux/response_length/clip_ratio`) and
warned about when they are many: a cut answer scores 0 whatever the model knows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.console import Console

from stratarl.algo.validation_stats import process_validation_metrics
from stratarl.assembly import algorithm, scoring
from stratarl.assembly.datasets import prompts_batch
from stratarl.cluster.handles import PolicyHandle
from stratarl.config import RunConfig
from stratarl.data.prompt_dataset import PromptDataset
from stratarl.observe.run_log import RunLog
from stratarl.reward.batch_scorer import RewardResult
from stratarl.rollout.interface import SamplingParams
from stratarl.trainer import phases
from stratarl.transport.data_proto import DataProto

CORE_METRIC_PREFIXES = ("mean@", "maj@", "best@", "pass@")
CLIP_WARNING_RATIO = 0.05  # warn when more validation responses than this hit the length limit


def run_validation(
    worker: PolicyHandle,
    dataset: PromptDataset,
    *,
    tokenizer: Any,
    compute_score: Callable[..., Any],
    sampling: SamplingParams,
    n: int,
    step: int,
    seed: int,
    prompts_per_batch: int = 256,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(metrics, one record per generation) over the whole validation set. A record holds the
    prompt, the ground truth, the response, how it ended, its reward and accuracy."""
    tally, records = ValidationTally(), []
    for start, batch in validation_batches(
        dataset, tokenizer, n=n, step=step, prompts_per_batch=prompts_per_batch
    ):
        batch = batch.union(worker.generate(batch, sampling, seed=seed + start * n))
        batch, result, texts = phases.reward(batch, tokenizer, compute_score)
        scores, accs = tally.add(batch, result, start)
        lengths = batch["response_mask"].sum(-1).tolist()
        records += [
            validation_record(
                batch, i, tokenizer, step=step, response=texts[i], reward=scores[i], acc=accs[i]
            )
            | {"response_tokens": int(lengths[i]), "finish_reason": batch["finish_reason"][i]}
            for i in range(len(batch))
        ]
    return tally.metrics(n) | length_metrics(records), records


def validation_batches(
    dataset: PromptDataset, tokenizer: Any, *, n: int, step: int, prompts_per_batch: int
) -> Iterator[tuple[int, DataProto]]:
    """The validation set in order, `prompts_per_batch` prompts at a time, each expanded to its n
    samples: (the batch's first row, the batch)."""
    for start in range(0, len(dataset), prompts_per_batch):
        indices = list(range(start, min(start + prompts_per_batch, len(dataset))))
        yield start, phases.expand_prompts(prompts_batch(dataset, indices, tokenizer.pad_token_id), n, step)


def validation_record(
    batch: DataProto, i: int, tokenizer: Any, *, step: int, response: str, reward: float, acc: float
) -> dict[str, Any]:
    """What validation_generations.jsonl keeps of sample i: its prompt row, the response and its score."""
    return {
        "step": step,
        "source_row": int(batch["source_row"][i]),
        "data_source": batch["data_source"][i],
        "prompt": tokenizer.decode(batch["raw_prompt_ids"][i]),
        "ground_truth": batch["ground_truth"][i],
        "response": response,
        "reward": reward,
        "acc": acc,
    }


def length_metrics(records: list[dict[str, Any]]) -> dict[str, float]:
    """Response lengths of the validation generations; clip_ratio: the share that stopped at the
    token limit (finish_reason "length") rather than at EOS."""
    lengths = [r["response_tokens"] for r in records]
    if not lengths:
        return {}
    return {
        "val-aux/response_length/mean": float(np.mean(lengths)),
        "val-aux/response_length/max": float(max(lengths)),
        "val-aux/response_length/clip_ratio": float(
            np.mean([r["finish_reason"] == "length" for r in records])
        ),
    }


def clipping_warning(metrics: dict[str, float], max_response_tokens: int) -> str | None:
    """A warning when many validation responses hit rollout.max_response_tokens (None otherwise)."""
    ratio = metrics.get("val-aux/response_length/clip_ratio", 0.0)
    if ratio <= CLIP_WARNING_RATIO:
        return None
    return (
        f"{ratio:.0%} of the validation responses stopped at rollout.max_response_tokens="
        f"{max_response_tokens} before EOS: an answer longer than that is cut, and scores as wrong. "
        "If the task's answers can be longer, raise it (`stratarl init` measures them)"
    )


@dataclass
class ValidationTally:
    """What the validation metrics are computed from, gathered batch by batch: each generation's
    data source, prompt uid (made unique across batches), reward and accuracy."""

    sources: list[str] = field(default_factory=list)
    uids: list[str] = field(default_factory=list)
    infos: dict[str, list[float]] = field(default_factory=lambda: {"reward": [], "acc": []})

    def add(self, batch: DataProto, result: RewardResult, start: int) -> tuple[list[float], list[float]]:
        """Record a scored batch; returns (rewards, accuracies). Accuracy is the scorer's `acc`, else
        reward > 0."""
        scores = result.scores.tolist()
        accs = result.extra.get("acc", [None] * len(scores))
        accs = [float(s > 0) if a is None else float(a) for a, s in zip(accs, scores, strict=True)]
        self.sources += list(batch["data_source"])
        self.uids += [f"{u}-{start}" for u in batch["uid"]]
        self.infos["reward"] += scores
        self.infos["acc"] += accs
        return scores, accs

    def metrics(self, n: int) -> dict[str, float]:
        """verl's flat `val-core/...` / `val-aux/...` metrics over everything recorded."""
        return flatten_validation_metrics(process_validation_metrics(self.sources, self.uids, self.infos), n)


def record_validation(
    log: RunLog,
    step: int,
    metrics: dict[str, float],
    records: list[dict[str, Any]],
    max_response_tokens: int,
    *,
    warn: bool = True,
) -> None:
    """A validation's metrics into metrics.jsonl, its generations into val_generations/step_<k>.jsonl,
    its core metrics (and a warning when responses were cut at the length limit) on the console."""
    log.log_metrics(step, metrics, phase="val")
    (log.run_dir / "val_generations").mkdir(exist_ok=True)
    RunLog.write_jsonl(log.run_dir / "val_generations" / f"step_{step}.jsonl", records)
    core = {k: v for k, v in metrics.items() if k.startswith("val-core/")}
    log.console.print(f"[bold cyan]validation @ step {step}[/bold cyan] {core}")
    warning = clipping_warning(metrics, max_response_tokens)
    if warning and warn:
        log.console.print(f"[yellow]warning: {warning}[/yellow]", soft_wrap=True)


def evaluate_accuracy(
    worker: PolicyHandle,
    cfg: RunConfig,
    tokenizer: Any,
    dataset: PromptDataset,
    step: int,
    *,
    console: Console | None = None,
) -> tuple[float, dict[str, float], list[dict[str, Any]]]:
    """(mean accuracy over data sources, all validation metrics, one record per generation) with
    the run's validation sampling; a `console` gets the clipping warning."""
    n = cfg.rollout.val_kwargs.n
    metrics, records = run_validation(
        worker,
        dataset,
        tokenizer=tokenizer,
        compute_score=scoring.build_compute_score(cfg),
        sampling=algorithm.val_sampling(cfg),
        n=n,
        step=step,
        seed=cfg.trainer.seed,
    )
    warning = clipping_warning(metrics, cfg.rollout.max_response_tokens)
    if warning and console is not None:
        console.print(f"[yellow]warning: {warning}[/yellow]", soft_wrap=True)
    return overall_accuracy(metrics, n), metrics, records


def flatten_validation_metrics(nested: dict[str, dict[str, dict[str, float]]], n: int) -> dict[str, float]:
    """{source: {var: {metric: v}}} -> verl's flat `val-core/...` and `val-aux/...` names."""
    flat: dict[str, float] = {}
    for source, by_variable in nested.items():
        core_variable = "acc" if "acc" in by_variable else "reward"
        for variable, metrics in by_variable.items():
            for metric, value in metrics.items():
                is_core = (
                    variable == core_variable
                    and metric.startswith(CORE_METRIC_PREFIXES)
                    and f"@{n}" in metric
                    and "std" not in metric
                )
                flat[f"{'val-core' if is_core else 'val-aux'}/{source}/{variable}/{metric}"] = value
    return flat


def accuracy_by_source(metrics: dict[str, float], n: int) -> dict[str, float]:
    """{data_source: mean accuracy} read from flattened validation metrics."""
    suffix = f"/acc/mean@{n}"
    return {key.split("/")[1]: value for key, value in metrics.items() if key.endswith(suffix)}


def overall_accuracy(metrics: dict[str, float], n: int) -> float:
    values = list(accuracy_by_source(metrics, n).values())
    return float(np.mean(values)) if values else float("nan")
