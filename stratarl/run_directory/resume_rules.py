"""Run directory, beside layer 2: which settings a resumed run may change from the config it ran with.

Three kinds of setting (each listed or matched below; tests/run_directory/test_run_directory.py checks
that every name is a real setting):

- FIXED: what the run *is* — the model and adapter shapes the checkpoint holds, the seed every
  random choice is drawn from, the batch shape and prompt order the sampler position counts in,
  the estimator. A resume that changes one is refused: it would not be this run any more.
- FREE: where outputs go, how often to validate, save and log, and where processes run; they
  never change what a training step computes, so they change without asking (and are recorded).
- everything else changes what later steps compute (a learning rate, the data, the step count
  that shapes the LR schedule, ...): a resume may change it only when the user lists it in
  `trainer.resume_allow_changes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from stratarl.config import RunConfig
from stratarl.config.loading import resolved_settings
from stratarl.config.setting import leaf_settings

FIXED: dict[str, str] = {
    "trainer.seed": "every random choice of a step is drawn from (seed, step)",
    "data.seed": "the sampler's prompt order is drawn from it",
    "data.shuffle": "the sampler's prompt order",
    "data.prompts_per_step": "the batch shape; the sampler's position counts batches of this size",
    "data.max_train_prompts": "the training subsample the sampler's position refers to",
    "rollout.n": "the batch shape: B·n trajectories per step",
    "model.path": "the checkpoint holds weights of this model",
    "model.tokenizer_path": "the token ids of every trajectory",
    "model.dtype": "the checkpoint's weights and optimizer states have this dtype",
    "actor.lora.rank": "the checkpoint holds adapters of this shape",
    "actor.lora.alpha": "the saved adapters were trained at this scale",
    "actor.lora.target_modules": "the checkpoint holds adapters on these modules",
    "critic.enable": "the checkpoint holds a critic, or none",
    "critic.model_path": "the checkpoint holds a critic of this model",
    "reference.model_path": "the KL terms so far were measured against this reference",
    "algorithm.adv_estimator": "the advantages so far came from this estimator",
    "algorithm.use_kl_in_reward": "the checkpoint holds the KL controller's state, or none",
    "agent.enable": "multi-turn episodes or single turns",
}

FREE_KEYS = frozenset(
    {
        "trainer.test_freq",
        "trainer.save_freq",
        "trainer.max_checkpoints_to_keep",
        "trainer.val_before_train",
        "trainer.val_only",
        "trainer.output_root",
        "trainer.run_dir",
        "trainer.project_name",
        "trainer.experiment_name",
        "trainer.logger",
        "trainer.save_trajectories",
        "trainer.resume_mode",
        "trainer.resume_from_path",
        "trainer.resume_allow_changes",
        "trainer.overwrite",
        "data.val_files",
        "data.max_val_prompts",
    }
)
# Placement (checkpoints load on any number of ranks), validation sampling, and the SFT settings
# that the RL trainer does not read.
FREE_PREFIXES = ("cluster.", "rollout.val_kwargs.", "sft.")


def is_free(key: str) -> bool:
    return key in FREE_KEYS or key.startswith(FREE_PREFIXES)


Change = tuple[Any, Any]  # (saved value, new value)


def config_changes(saved_config: Path, cfg: RunConfig) -> dict[str, Change]:
    """Every setting whose value in `cfg` differs from `saved_config` (a run's config.yaml), paths
    compared absolute; a setting the saved file lacks (added to the schema since) counts as its
    default."""
    saved = _flat(OmegaConf.to_container(OmegaConf.load(saved_config), resolve=True))
    new = _flat(resolved_settings(cfg, absolute_paths=True))
    changes = {}
    for key, info in leaf_settings(RunConfig).items():
        old = saved.get(key, info.default)
        if old != new[key]:
            changes[key] = (old, new[key])
    return changes


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for name, value in tree.items():
        key = f"{prefix}{name}"
        is_section = isinstance(value, dict) and key not in leaf_settings(RunConfig)
        flat |= _flat(value, f"{key}.") if is_section else {key: value}
    return flat


@dataclass
class ChangeReview:
    """A resume's config changes sorted by what may happen to them."""

    fixed: dict[str, Change] = field(default_factory=dict)  # refused
    not_allowed: dict[str, Change] = field(default_factory=dict)  # need trainer.resume_allow_changes
    accepted: dict[str, Change] = field(default_factory=dict)  # free, or allowed
    bad_allowances: list[str] = field(default_factory=list)  # unknown or fixed keys in the allow list
    allowed: list[str] = field(default_factory=list)  # trainer.resume_allow_changes as given

    @property
    def refused(self) -> bool:
        return bool(self.fixed or self.not_allowed or self.bad_allowances)

    def explain(self) -> str:
        """The refusal as lines: each changed key with its old and new value, and why."""
        lines = []
        if self.fixed:
            lines.append("  cannot change within a run (start a new one instead):")
            lines += [f"    {k}: {_show(a)} → {_show(b)}   ({FIXED[k]})" for k, (a, b) in self.fixed.items()]
        if self.not_allowed:  # the whole list to give, the allowances already given included
            keys = ",".join(dict.fromkeys([*self.allowed, *self.not_allowed]))
            lines.append(
                f"  change what later steps compute; allow them with trainer.resume_allow_changes=[{keys}]:"
            )
            lines += [f"    {k}: {_show(a)} → {_show(b)}" for k, (a, b) in self.not_allowed.items()]
        lines += [f"  trainer.resume_allow_changes: {problem}" for problem in self.bad_allowances]
        return "\n".join(lines)


def review_changes(changes: dict[str, Change], allowed: list[str]) -> ChangeReview:
    review = ChangeReview(allowed=list(allowed))
    leaves = leaf_settings(RunConfig)
    for key in allowed:
        if key not in leaves:
            review.bad_allowances.append(f"{key!r} is not a setting")
        elif key in FIXED:
            review.bad_allowances.append(f"{key!r} cannot change within a run ({FIXED[key]})")
    for key, change in changes.items():
        if key == "trainer.resume_allow_changes":  # the permission itself is not part of the run
            continue
        if key in FIXED:
            review.fixed[key] = change
        elif is_free(key) or key in allowed:
            review.accepted[key] = change
        else:
            review.not_allowed[key] = change
    return review


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)
