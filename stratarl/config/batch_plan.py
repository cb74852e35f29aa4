"""Layer 1, config: the batch plan — how one training step splits into optimizer steps and passes.

verl's batch semantics (its ppo_mini_batch_size counts prompts, micro-batches count trajectories):

    N = B · n                                   trajectories per step
    mini-batches per step      = B / prompts_per_mini_batch
    optimizer steps per step   = mini-batches per step · ppo_epochs
    micro-batches per mini-batch = prompts_per_mini_batch · n / trajectories_per_micro_batch
                                 (= gradient-accumulation steps of one optimizer step)

The trainer prints this at start-up, so a user sees what a config means before anything runs.
One process holds the whole mini-batch; data-parallel ranks will divide it further.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rich.table import Table

from stratarl.config.errors import ConfigError, ConfigProblem
from stratarl.config.schema_run import RunConfig

_POSITIVE = (
    "data.prompts_per_step",
    "rollout.n",
    "actor.prompts_per_mini_batch",
    "actor.trajectories_per_micro_batch",
    "actor.ppo_epochs",
    "data.max_prompt_tokens",
    "rollout.max_response_tokens",
)


def _split_problems(
    prompts_per_step: int, n: int, per_mini: int, per_micro: int, role: str
) -> list[ConfigProblem]:
    """Divisibility of one role's split: B by prompts per mini-batch, its trajectories by the micro size."""
    problems = []
    mini_key, micro_key = f"{role}.prompts_per_mini_batch", f"{role}.trajectories_per_micro_batch"
    if per_mini > 0 and prompts_per_step % per_mini:
        problems.append(
            ConfigProblem(
                ("data.prompts_per_step", mini_key),
                f"data.prompts_per_step={prompts_per_step} is not divisible by {mini_key}={per_mini}; "
                f"every optimizer step must see the same number of prompts",
            )
        )
    if per_mini > 0 and per_micro > 0 and (per_mini * n) % per_micro:
        problems.append(
            ConfigProblem(
                (mini_key, "rollout.n", micro_key),
                f"a mini-batch has {mini_key}·rollout.n = {per_mini}·{n} = {per_mini * n} trajectories, "
                f"not divisible by {micro_key}={per_micro}",
            )
        )
    return problems


def batch_size_problems(cfg: RunConfig) -> list[ConfigProblem]:
    """Every reason the batch sizes of `cfg` cannot be split into whole mini- and micro-batches."""
    problems = []
    for key in _POSITIVE:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value <= 0:
            problems.append(ConfigProblem((key,), f"must be a positive integer, got {value}"))
    B, n = cfg.data.prompts_per_step, cfg.rollout.n
    problems += _split_problems(
        B, n, cfg.actor.prompts_per_mini_batch, cfg.actor.trajectories_per_micro_batch, "actor"
    )
    if cfg.uses_critic:
        problems += _split_problems(
            B, n, cfg.critic.prompts_per_mini_batch, cfg.critic.trajectories_per_micro_batch, "critic"
        )
    return problems


@dataclass(frozen=True)
class BatchPlan:
    """The numbers of one training step of the actor, computed from a valid config."""

    prompts_per_step: int  # B
    samples_per_prompt: int  # n
    trajectories_per_step: int  # N = B·n
    prompts_per_mini_batch: int
    trajectories_per_mini_batch: int  # prompts_per_mini_batch · n
    mini_batches_per_step: int  # B / prompts_per_mini_batch
    ppo_epochs: int
    optimizer_steps_per_step: int  # mini_batches_per_step · ppo_epochs
    trajectories_per_micro_batch: int
    micro_batches_per_mini_batch: int  # trajectories_per_mini_batch / trajectories_per_micro_batch
    gradient_accumulation_steps: int  # = micro_batches_per_mini_batch (one process)
    max_prompt_tokens: int  # P
    max_response_tokens: int  # T
    max_tokens_per_trajectory: int  # P + T
    max_tokens_per_micro_batch: int  # trajectories_per_micro_batch · (P + T)
    token_budget: int | None = None  # actor.max_tokens_per_micro_batch: micro-batches by tokens

    @classmethod
    def from_config(cls, cfg: RunConfig) -> BatchPlan:
        """The plan of `cfg`; ConfigError naming the keys when the sizes do not divide."""
        problems = batch_size_problems(cfg)
        if problems:
            raise ConfigError(problems)
        B, n = cfg.data.prompts_per_step, cfg.rollout.n
        per_mini, per_micro = cfg.actor.prompts_per_mini_batch, cfg.actor.trajectories_per_micro_batch
        mini_batches = B // per_mini
        micro_batches = per_mini * n // per_micro
        P, T = cfg.data.max_prompt_tokens, cfg.rollout.max_response_tokens
        return cls(
            prompts_per_step=B,
            samples_per_prompt=n,
            trajectories_per_step=B * n,
            prompts_per_mini_batch=per_mini,
            trajectories_per_mini_batch=per_mini * n,
            mini_batches_per_step=mini_batches,
            ppo_epochs=cfg.actor.ppo_epochs,
            optimizer_steps_per_step=mini_batches * cfg.actor.ppo_epochs,
            trajectories_per_micro_batch=per_micro,
            micro_batches_per_mini_batch=micro_batches,
            gradient_accumulation_steps=micro_batches,
            max_prompt_tokens=P,
            max_response_tokens=T,
            max_tokens_per_trajectory=P + T,
            token_budget=cfg.actor.max_tokens_per_micro_batch,
            max_tokens_per_micro_batch=per_micro * (P + T),
        )

    def as_dict(self) -> dict[str, int]:
        """Every number of the plan by name (for metrics and the run directory)."""
        return dataclasses.asdict(self)

    def rows(self) -> list[tuple[str, str, str]]:
        """(quantity, value, where it comes from) for each line of the printed plan."""
        return [
            ("prompts per step (B)", f"{self.prompts_per_step}", "data.prompts_per_step"),
            ("samples per prompt (n)", f"{self.samples_per_prompt}", "rollout.n"),
            ("trajectories per step (N)", f"{self.trajectories_per_step}", "B · n"),
            ("prompts per mini-batch", f"{self.prompts_per_mini_batch}", "actor.prompts_per_mini_batch"),
            ("trajectories per mini-batch", f"{self.trajectories_per_mini_batch}", "prompts/mini-batch · n"),
            ("mini-batches per step", f"{self.mini_batches_per_step}", "B / prompts per mini-batch"),
            (
                "optimizer steps per step",
                f"{self.optimizer_steps_per_step}",
                f"mini-batches · actor.ppo_epochs ({self.ppo_epochs})",
            ),
            (
                "trajectories per micro-batch",
                f"{self.trajectories_per_micro_batch}",
                "actor.trajectories_per_micro_batch",
            ),
            (
                "micro-batches per mini-batch",
                f"{self.micro_batches_per_mini_batch}",
                "= gradient-accumulation steps",
            ),
            (
                "max tokens per trajectory",
                f"{self.max_tokens_per_trajectory}",
                f"P + T = {self.max_prompt_tokens} + {self.max_response_tokens}",
            ),
            (
                "max tokens per micro-batch",
                f"{self.max_tokens_per_micro_batch}",
                "trajectories per micro-batch · (P + T)",
            )
            if self.token_budget is None
            else (
                "max tokens per micro-batch",
                f"{self.token_budget}",
                "actor.max_tokens_per_micro_batch (real tokens): the fewest balanced micro-batches "
                "under it replace trajectories per micro-batch",
            ),
        ]

    def render(self) -> Table:
        """The plan as a rich Table, for the console at start-up."""
        table = Table(title="batch plan (one training step)")
        table.add_column("quantity")
        table.add_column("value", justify="right")
        table.add_column("from")
        for row in self.rows():
            table.add_row(*row)
        return table

    def to_text(self) -> str:
        """The plan as plain aligned text, for logs and files."""
        rows = self.rows()
        width = max(len(name) for name, _, _ in rows)
        value_width = max(len(value) for _, value, _ in rows)
        lines = ["batch plan (one training step)"]
        lines += [f"  {name:<{width}}  {value:>{value_width}}  {source}" for name, value, source in rows]
        return "\n".join(lines)
