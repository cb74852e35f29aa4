"""The command line's help texts: each command's main settings, examples and where to read on.

Epilogs for argparse (`RawDescriptionHelpFormatter` keeps their layout). Built from plain strings
and the recipe files found beside the package, so `stratarl --help` imports nothing heavy. Every
setting named here is a key of the config schema (tests/test_cli.py checks it).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
DOCS = "docs/config.md"
SETTINGS_TITLE = (
    "main settings (key=value after the recipe; every setting, its default and unit: docs/config.md):"
)

TRAIN_SETTINGS = (
    ("model.path=DIR", "the HF model directory to start from (e.g. an SFT run's final/)"),
    ("data.train_files=[a.parquet]", "verl-schema parquet; data.val_files=[b.parquet] for validation"),
    ("trainer.total_steps=60", "training steps (null: trainer.total_epochs passes over the data)"),
    ("data.prompts_per_step=32", "prompts per step"),
    ("rollout.n=8", "samples per prompt (the GRPO group)"),
    ("rollout.max_response_tokens=64", "longest response"),
    ("actor.lr=1e-6", "the policy's learning rate"),
    ("algorithm.adv_estimator=grpo", "advantage estimator: grpo, gae (PPO with a critic), rloo, ..."),
    ("trainer.test_freq=20", "validate every N steps (and at the last)"),
    ("trainer.save_freq=10", "checkpoint every N steps (default 0: none); the same command resumes"),
    ("trainer.experiment_name=NAME", "the run directory: trainer.output_root/project_name/NAME"),
)
SFT_SETTINGS = (
    ("model.path=DIR", "the HF model directory to start from"),
    ("data.train_files=[a.parquet]", "rows with extra_info['answer'] (the reference response)"),
    ("data.val_files=[b.parquet]", "held-out rows: greedy accuracy before and after"),
    ("sft.total_steps=300", "optimizer steps (null: sft.total_epochs passes)"),
    ("sft.lr=1e-3", "peak learning rate"),
    ("sft.trajectories_per_step=32", "examples per optimizer step"),
    ("sft.max_tokens=1024", "longest example (prompt + answer + EOS); a longer one is refused"),
    ("trainer.experiment_name=NAME", "the run directory: trainer.output_root/project_name/NAME-sft"),
)
QUICKSTART_SETTINGS = (
    ("sft.total_steps=150", "the SFT warm-start's steps"),
    ("trainer.total_steps=50", "GRPO steps"),
    ("rollout.n=8", "samples per prompt"),
    ("actor.lr=1e-4", "GRPO's learning rate"),
)


def recipe_lines() -> list[str]:
    """One line per recipe file: its path and the first line of its opening comment."""
    if not RECIPES.is_dir():
        return ["  (recipes/ is in the stratarl repository, beside the package)"]
    lines = []
    for path in sorted(RECIPES.glob("*.yaml")):
        first = path.read_text(encoding="utf-8").splitlines()[:1]
        about = first[0].lstrip("# ").strip() if first and first[0].startswith("#") else ""
        lines.append(f"  recipes/{path.name:<30} {textwrap.shorten(about, 70, placeholder=' …')}")
    return lines


def _settings(title: str, settings: tuple[tuple[str, str], ...]) -> list[str]:
    return [title, *(f"  {key:<33} {about}" for key, about in settings)]


def _join(*blocks: list[str]) -> str:
    return "\n\n".join("\n".join(block) for block in blocks if block)


def train_epilog() -> str:
    return _join(
        _settings(SETTINGS_TITLE, TRAIN_SETTINGS),
        ["recipes:", *recipe_lines()],
        [
            "examples:",
            "  stratarl train recipes/grpo_arithmetic.yaml model.path=DIR data.train_files=[a.parquet] \\",
            "      rollout.n=8 trainer.save_freq=10",
            "  stratarl train recipes/ppo_arithmetic.yaml model.path=DIR trainer.total_steps=100",
        ],
        [
            "Ctrl-C stops after the current step (a checkpoint where trainer.save_freq allows) and prints",
            "the command that continues. Your own task: docs/own_task.md; recipes: docs/recipes.md;",
            "a run that misbehaves: docs/debugging.md (stratarl doctor, stratarl trace).",
        ],
    )


def verl_epilog() -> str:
    return _join(
        [
            "example (the form of verl's examples/ scripts):",
            "  stratarl verl algorithm.adv_estimator=grpo data.train_files=[a.parquet] "
            "data.val_files=[b.parquet] \\",
            "      data.train_batch_size=32 actor_rollout_ref.model.path=DIR actor_rollout_ref.rollout.n=8 "
            "\\",
            "      actor_rollout_ref.actor.ppo_mini_batch_size=16 "
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \\",
            "      actor_rollout_ref.rollout.name=vllm trainer.n_gpus_per_node=1 trainer.nnodes=1 "
            "trainer.total_training_steps=2",
        ],
        [
            "It starts from verl 0.9.1's defaults (not ours). Every verl key is translated, accepted as "
            "having",
            "no effect here, or refused unless it holds verl's default; RUN/verl_translation.json records "
            "it.",
            "The table and what is refused: docs/config.md#running-a-verl-command-line.",
        ],
    )


def config_epilog() -> str:
    return _join(
        [
            "examples:",
            "  stratarl config runs/stratarl/grpo              the run's resolved settings, as YAML",
            "  stratarl config recipes/quickstart.yaml --as-verl   the verl command line of a recipe",
        ],
        [
            "--as-verl starts from verl 0.9.1's defaults and sets only what differs; settings verl cannot",
            "take (our async modes, stratarl-only keys) are listed after it as comments, never dropped.",
            "The way in: `stratarl verl ...`; the tables: docs/config.md#running-a-verl-command-line.",
        ],
    )


def sft_epilog() -> str:
    return _join(
        _settings(SETTINGS_TITLE, SFT_SETTINGS),
        ["recipes (sft reads data.*, model.*, sft.* and rollout.val_kwargs):", *recipe_lines()],
        ["example:", "  stratarl sft recipes/quickstart.yaml model.path=DIR sft.total_steps=300"],
        ["The weights land in <run dir>/final: give them to `stratarl train ... model.path=`.",
         "Your own task: docs/own_task.md."],
    )  # fmt: skip


def quickstart_epilog() -> str:
    return _join(
        _settings("main settings (key=value overrides of recipes/quickstart.yaml; every setting: "
                  + DOCS + "):", QUICKSTART_SETTINGS),
        ["examples:", "  stratarl quickstart", "  stratarl quickstart --task tool --run-dir runs/tool",
         "  stratarl quickstart sft.total_steps=200 rollout.n=4"],
        ["What it does and what it measured: README.md and docs/benchmarks.md."],
    )  # fmt: skip


def init_epilog() -> str:
    return _join(
        ["writes <out>/model (a tokenizer and a tiny model trained on your prompts, unless --model) and",
         "<out>/recipe.yaml (settings sized from your data), then prints the sft and train commands."],
        ["example:",
         "  stratarl init data/train.parquet --val data/test.parquet --reward my_reward.py --out mytask"],
        ["The walk-through with measured numbers: docs/own_task.md; every setting of the recipe:",
         "docs/config.md. The recipes in the repository:", *recipe_lines()],
    )  # fmt: skip


def observe_epilog(command: str) -> str:
    examples = {
        "trace": ["  stratarl trace RUN --worst", "  stratarl trace RUN --step 10 --where 'reward == 0'",
                  "  stratarl trace RUN --field old_log_probs --html trace.html"],
        "doctor": ["  stratarl doctor RUN", "  stratarl doctor RUN --json"],
        "plot": ["  stratarl plot RUN --out pngs/"],
    }  # fmt: skip
    return _join(
        ["examples:", *examples[command]],
        ["RUN is a run directory, finished or still running (trainer.output_root/project_name/",
         "experiment_name). What each check and field means: docs/debugging.md; the settings a run",
         "used are in RUN/config.yaml (all of them explained in " + DOCS + ")."],
    )  # fmt: skip


def data_epilog() -> str:
    return _join(
        ["examples:", "  stratarl data make arithmetic --out data/arith --digits 1 2 --operators +-",
         "  stratarl data make tool_arithmetic --out data/tool"],
        ["The parquet schema (verl's) and how to write your own: docs/data_and_rewards.md and",
         "docs/own_task.md; then point data.train_files / data.val_files at the files (" + DOCS + ")."],
    )  # fmt: skip


def model_epilog() -> str:
    return _join(
        ["example:", "  stratarl model import-gguf smollm2.gguf models/smollm2"],
        ["Then train from it with model.path=models/smollm2, e.g. recipes/grpo_smollm2_arithmetic.yaml",
         "(README.md, 'A real pretrained model, offline'); every setting: " + DOCS + "."],
    )  # fmt: skip


def explain_field_epilog() -> str:
    return _join(
        ["example:", "  stratarl explain-field response_mask"],
        ["Every standard batch field: docs/fields.md; the settings that shape them: " + DOCS + "."],
    )
