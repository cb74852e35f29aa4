"""Layer 1, config: the "Running a verl command line" section of docs/config.md, generated from the
classification tables of `verl_translation` (rendered by `markdown.render_config_markdown`)."""

from __future__ import annotations

from stratarl.config.verl_translation import NO_EFFECTS, REFUSALS, TRANSLATIONS

INTRO = """\
## Running a verl command line

`stratarl verl` takes the arguments of `python3 -m verl.trainer.main_ppo` as they are — Hydra
overrides (`key=value`, `+key=value` to add a key, `~key` to delete one, lists as verl's example
scripts write them: `data.train_files="['a.parquet', 'b.parquet']"`, quoted values) and optionally
a verl YAML config (`--config-path DIR --config-name NAME`, whose `defaults` may name only
`ppo_trainer`). It starts from **verl 0.9.1's defaults** (the generated `ppo_trainer.yaml` in verl's
wheel, read as YAML; verl is not imported), not ours: where verl's default differs from ours
(`data.train_batch_size=1024`, `trainer.total_epochs=30`, gradient checkpointing on, bf16 rollout
and mixed precision, 8 GPUs), the run uses verl's. It then translates every key, validates, and trains
with the same path as `stratarl train`:

    stratarl verl algorithm.adv_estimator=grpo \\
        data.train_files=[data/train.parquet] data.val_files=[data/test.parquet] \\
        data.train_batch_size=32 data.max_prompt_length=256 data.max_response_length=128 \\
        actor_rollout_ref.model.path=models/tiny actor_rollout_ref.actor.optim.lr=1e-6 \\
        actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 actor_rollout_ref.actor.use_kl_loss=True \\
        actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8 \\
        trainer.logger='["console"]' trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.total_training_steps=2

`--dry-run` prints what each given key became and the batch plan, and stops. Every verl key is in
one of three classes (`stratarl/config/verl_table_policy.py`, `verl_table_run.py`, `verl_table_reward.py`;
`tests/config/test_verl_translation.py` fails when verl's generated config has a leaf in none):

- **translated**: it sets our key, with the value mapping where units or spellings differ (below);
  `data.train_batch_size` and `ppo_mini_batch_size` count prompts, as ours do;
  `*_micro_batch_size_per_gpu` counts trajectories per worker, as ours do (the deprecated global
  `ppo_micro_batch_size` is divided by the GPUs); `trainer.n_gpus_per_node × trainer.nnodes` is our
  number of training processes (more than one: Ray); `rollout.name=vllm` runs vLLM where it is
  installed, else our torch engine with the same sampling.
- **no effect here**: accepted and changes nothing — GPU-memory, kernel, offload, serving and
  profiling knobs (`use_liger`, `use_fused_kernels`, `gpu_memory_utilization`, `use_shm`,
  `layered_summon`, tensor-parallel sizes, ...), each listed with its reason.
- **refused**: accepted only at verl's default; any other value stops the run with the reason and
  our nearest way (`actor_rollout_ref.actor.strategy=megatron`, `rollout.name=sglang`, Ulysses
  sequence parallelism, QAT, distillation, verl's v1 async loops, custom reward managers, ...).

Unknown keys (with the nearest verl key), refused values, and our validation (in verl's names and
ours: `actor_rollout_ref.model.path (our model.path): directory not found`) are one message, exit
code 2, before torch is imported. The run directory records the translation in
`verl_translation.json`: the command line, and for every translated key (given or at verl's
default) and every other key given, the verl key, its value, where it came from, its class, our key
and our value (or the reason). verl's `actor_rollout_ref.rollout.seed` (42) is our `trainer.seed`,
which seeds sampling, initialisation and the mini-batch shuffle; verl's `data.seed` (null: an unseeded
prompt order) is our `data.seed` (null: from `trainer.seed`, so the order repeats); its other seeds
have no effect. More than one training process with `trainer.device=cuda` reserves one GPU per
process where the machine has NVIDIA GPUs or `ray_kwargs.ray_init.address` names a cluster.

**The way back.** `stratarl config RUN --as-verl` (RUN: a run directory, or a recipe file with
overrides) prints the `python3 -m verl.trainer.main_ppo` line that trains the same run: verl's
defaults, and an override for every translated setting whose value differs from what they give
(`stratarl/config/verl_way_back.py`). The line is translated back before it is printed; a setting
it does not carry (our `one_step_off`/`async` modes, settings no verl key has, such as
`cluster.host_allocator`) is listed after it as a comment with the reason, never dropped.
`tests/config/test_verl_way_back.py` takes five verl lines (GRPO with LoRA, PPO with a critic, DAPO,
REINFORCE++, a multi-turn tool recipe) through verl → ours → verl and every recipe in `recipes/`
through ours → verl → ours. Taking a script from verl's `examples/`:
[coming_from_verl.md](coming_from_verl.md).
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _keys(keys: tuple[str, ...]) -> str:
    return ", ".join(f"`{key}`" for key in keys)


def render_verl_section() -> list[str]:
    """The section's lines: the intro, then one table per class."""
    lines = [
        INTRO,
        "### Translated verl keys",
        "",
        "| verl key(s) | our key | value mapping |",
        "|---|---|---|",
    ]
    for rule in TRANSLATIONS:
        reads = _keys(rule.reads + tuple(f"{prefix}.*" for prefix in rule.subtrees))
        lines.append(f"| {_cell(reads)} | `{rule.ours}` | {_cell(rule.how or 'the same value')} |")
    lines += ["", "### verl keys with no effect here", "", "| verl keys (patterns) | why |", "|---|---|"]
    lines += [f"| {_cell(_keys(rule.patterns))} | {_cell(rule.reason)} |" for rule in NO_EFFECTS]
    lines += ["", "### verl keys refused unless at verl's default", ""]
    lines += ["| verl keys (patterns) | why | our nearest way |", "|---|---|---|"]
    for rule in REFUSALS:
        allowed = f" (also accepted: {', '.join(map(str, rule.allowed))})" if rule.allowed else ""
        lines.append(
            f"| {_cell(_keys(rule.patterns))} | {_cell(rule.reason + allowed)} | {_cell(rule.our_way)} |"
        )
    lines.append(
        "\nA key matched by several rows takes the first class in the order translated, no effect, refused."
    )
    return lines
