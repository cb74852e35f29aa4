"""Application: `stratarl init` — from any verl-schema parquet to a tiny model and a recipe.

1. a byte-level BPE tokenizer trained on the task's own text and a random-init tiny model
   (`data.tiny_models`), in <out>/model — or a model directory of the user's (`model_path`);
2. the task measured with that tokenizer: rows, data sources, prompt and reference-answer lengths;
3. the reward checked on the data: the custom function loads, or every data_source is registered,
   and the reference answers (extra_info.answer) score what a correct response should;
4. with sft_share below 1 (the default is 1: no split, see SFT_SHARE), the training rows split by a
   seeded permutation into <out>/data/sft_train.parquet (sft.train_files) and
   <out>/data/rl_train.parquet (data.train_files), so that GRPO samples prompts SFT did not train on;
5. <out>/recipe.yaml: the data, the model, the reward, lengths sized from the measurement
   (rollout.max_response_tokens covers the longest reference answer, with room to spare), and the
   SFT and GRPO settings measured on a task of this kind — one file that shows every knob it sets.

docs/own_task.md walks through it and says how the numbers were chosen.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from transformers import AutoTokenizer

from stratarl.data.prompt_dataset import load_prompt_dataset
from stratarl.data.tiny_models import MODEL_PRESETS, build_tiny_model
from stratarl.data.tokenizer_factory import corpus_from_parquet, train_tokenizer
from stratarl.reward.batch_scorer import score_batch
from stratarl.reward.custom import load_custom_scorer
from stratarl.reward.registry import SCORERS, default_compute_score

RESPONSE_HEADROOM = 1.5  # max_response_tokens = headroom × the longest reference answer (+ EOS)
SCORED_ANSWERS = 256  # reference answers scored to check the reward
# The share of the training rows SFT trains on; GRPO gets the rest (1: no split, both train on every
# row). Measured with the 1M model on three word tasks (docs/own_task.md, "Three more tasks"): a split
# of 0.5 left SFT 3.5-5 points lower held out and GRPO added nothing on its unseen half (-1.0 to +0.5
# points), so the pipeline ended 4.5-5.5 points below no split; 0.8 on first_letter ended 4.5 points
# below its own SFT. No split is the default until a split measures better.
SFT_SHARE = 1.0
# A model below this many parameters is taken as trained from scratch (the tiny path: init's own
# presets reach 50M); a larger one as pretrained (the smallest chat models people fine-tune, e.g.
# SmolLM2-135M, are larger), whose recipe is the SmolLM2 recipe's scale.
PRETRAINED_FROM_PARAMETERS = 60_000_000


@dataclass(frozen=True)
class ModelScale:
    """What the recipe's numbers depend on: the model's size, and whether it starts pretrained."""

    parameters: int
    pretrained: bool

    @classmethod
    def of(cls, model_dir: str | Path) -> ModelScale:
        parameters = count_parameters(model_dir)
        return cls(parameters, pretrained=parameters >= PRETRAINED_FROM_PARAMETERS)

    def line(self) -> str:
        kind = (
            "pretrained: the recipe is sized for fine-tuning it"
            if self.pretrained
            else "trained from scratch"
        )
        return f"model: {self.parameters / 1e6:.1f}M parameters, {kind}"


def count_parameters(model_dir: str | Path) -> int:
    """The parameters of an HF model directory, from its safetensors headers (no weight is read)."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no *.safetensors weights to size the recipe from")
    total = 0
    for path in files:
        with safe_open(str(path), framework="np") as weights:
            for name in weights.keys():  # noqa: SIM118 (safe_open has keys(), no __iter__)
                total += math.prod(weights.get_slice(name).get_shape())
    return total


@dataclass(frozen=True)
class RowSplit:
    """The training rows split between SFT (sft.train_files) and GRPO (data.train_files)."""

    sft_file: str
    sft_rows: int
    rl_file: str
    rl_rows: int
    share: float

    def line(self) -> str:
        return (
            f"split (seeded, sft share {self.share:g}): {self.sft_rows} rows for SFT in {self.sft_file}, "
            f"{self.rl_rows} other rows for GRPO in {self.rl_file}"
        )


def split_rows(train_files: list[str], out_dir: Path, sft_share: float, seed: int = 0) -> RowSplit | None:
    """The rows of `train_files`, in one seeded permutation, written as out_dir/data/sft_train.parquet
    (round(sft_share × rows) of them) and out_dir/data/rl_train.parquet (the others), every column as
    read; None for a share of 0 or 1 (no split: both train on `train_files`). ValueError for a share
    outside [0, 1] or a part that would be empty."""
    if not 0.0 <= sft_share <= 1.0:
        raise ValueError(f"the SFT share {sft_share:g} is not between 0 and 1")
    if sft_share in (0.0, 1.0):
        return None
    table = pa.concat_tables([pq.read_table(f) for f in train_files], promote_options="default")
    order = np.random.default_rng(seed).permutation(table.num_rows)
    n_sft = round(sft_share * table.num_rows)
    if not 0 < n_sft < table.num_rows:
        raise ValueError(
            f"an SFT share of {sft_share:g} of {table.num_rows} training rows leaves SFT or GRPO no row: "
            "give more rows, or a share of 1 (both train on every row)"
        )
    data = out_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    sft_file, rl_file = data / "sft_train.parquet", data / "rl_train.parquet"
    pq.write_table(table.take(np.sort(order[:n_sft])), sft_file)
    pq.write_table(table.take(np.sort(order[n_sft:])), rl_file)
    return RowSplit(str(sft_file), n_sft, str(rl_file), table.num_rows - n_sft, sft_share)


@dataclass
class TaskProfile:
    """What `stratarl init` measured on the training split, with the task's own tokenizer."""

    rows: int
    data_sources: dict[str, int]
    prompt_tokens: dict[str, int]  # p50, p95, max of the chat-templated prompts
    answer_tokens: dict[str, int] = field(default_factory=dict)  # the same for extra_info.answer + EOS
    answer_score: float | None = None  # mean reward of the reference answers
    answer_rows: int = 0
    model: str = ""  # the model's scale (ModelScale.line) when it is the user's
    split: RowSplit | None = None  # the rows of SFT and of GRPO, when init split them

    def lines(self) -> list[str]:
        out = [self.model] if self.model else []
        out += [
            f"rows: {self.rows}; data sources: {self.data_sources}",
            f"prompt tokens (chat template included): {self.prompt_tokens}",
        ]
        if self.answer_tokens:
            out.append(f"reference answer tokens (with EOS), {self.answer_rows} rows: {self.answer_tokens}")
        else:
            out.append("no extra_info.answer in the rows: SFT needs one per row (verl's SFT convention)")
        if self.answer_score is not None:
            out.append(f"mean reward of the reference answers: {self.answer_score:.3f}")
        if self.split is not None:
            out.append(self.split.line())
        return out


def _quantiles(lengths: list[int]) -> dict[str, int]:
    values = np.asarray(lengths)
    return {
        "p50": int(np.percentile(values, 50)),
        "p95": int(np.percentile(values, 95)),
        "max": int(values.max()),
    }


def profile_task(
    train_files: list[str], tokenizer: Any, compute_score: Any, *, max_prompt_tokens: int = 100_000
) -> TaskProfile:
    """Measure the training rows; score up to SCORED_ANSWERS reference answers with the reward."""
    dataset = load_prompt_dataset(train_files, tokenizer, max_prompt_tokens=max_prompt_tokens)
    items = dataset.items
    sources: dict[str, int] = {}
    for item in items:
        sources[item.data_source] = sources.get(item.data_source, 0) + 1
    profile = TaskProfile(
        rows=len(items), data_sources=sources, prompt_tokens=_quantiles([len(it.prompt_ids) for it in items])
    )
    answered = [it for it in items if isinstance((it.extra_info or {}).get("answer"), str)]
    if answered:
        lengths = [
            len(tokenizer.encode(it.extra_info["answer"], add_special_tokens=False)) + 1 for it in answered
        ]
        profile.answer_tokens, profile.answer_rows = _quantiles(lengths), len(answered)
        sample = answered[:SCORED_ANSWERS]
        result = score_batch(
            [it.data_source for it in sample],
            [it.extra_info["answer"] for it in sample],
            [it.ground_truth for it in sample],
            [it.extra_info for it in sample],
            compute_score=compute_score,
        )
        profile.answer_score = float(result.scores.mean())
    return profile


def _round_up(value: float, multiple: int = 8) -> int:
    return int(math.ceil(value / multiple) * multiple)


@dataclass(frozen=True)
class RecipeNumbers:
    """The SFT and GRPO numbers of a starter recipe, for one kind of model (the rest are measured)."""

    lr: float  # actor.lr
    sft_lr: float
    sft_warmup_steps: int
    sft_total_steps: int  # a cap: sft.stop_on_plateau ends SFT earlier (with validation files)
    sft_test_freq: int
    sft_per_step: int  # sft.trajectories_per_step (= its micro-batch)
    prompts_per_step: int  # = actor.prompts_per_mini_batch: one update per step
    trajectories_per_micro_batch: int
    temperature: float
    total_steps: int
    test_freq: int
    warmup_steps: int | None = None  # actor.warmup_steps; None keeps the default


# Measured on tiny models (docs/own_task.md): a random-init 1M model needed 300 SFT steps on sorting
# and 600 on a 200-word text task; held-out accuracy every 100 steps ends SFT on a plateau.
TINY_NUMBERS = RecipeNumbers(
    lr=3.0e-4, sft_lr=1.0e-3, sft_warmup_steps=10, sft_total_steps=1500, sft_test_freq=100,
    sft_per_step=64, prompts_per_step=32, trajectories_per_micro_batch=64, temperature=1.0,
    total_steps=60, test_freq=20,
)  # fmt: skip
# recipes/grpo_smollm2_arithmetic.yaml's numbers, measured on SmolLM2-135M-Instruct on 2 CPU cores
# (docs/benchmarks.md): fine-tuning rates, 16 prompts × 8 samples a step, sampling at τ = 0.6.
PRETRAINED_NUMBERS = RecipeNumbers(
    lr=1.0e-5, sft_lr=1.0e-5, sft_warmup_steps=0, sft_total_steps=200, sft_test_freq=25,
    sft_per_step=16, prompts_per_step=16, trajectories_per_micro_batch=32, temperature=0.6,
    total_steps=30, test_freq=5, warmup_steps=0,
)  # fmt: skip
LARGE_MODEL_LR = 1.0e-6  # from 1B parameters: the rate of verl's examples for 0.5–7B models


def recipe_numbers(scale: ModelScale | None) -> RecipeNumbers:
    """The tiny path's numbers, or for a pretrained `scale` the SmolLM2 recipe's (1e-6 from 1B)."""
    if scale is None or not scale.pretrained:
        return TINY_NUMBERS
    if scale.parameters >= 1_000_000_000:
        return dataclasses.replace(PRETRAINED_NUMBERS, lr=LARGE_MODEL_LR, sft_lr=LARGE_MODEL_LR)
    return PRETRAINED_NUMBERS


def starter_recipe(
    profile: TaskProfile,
    *,
    train_files: list[str],
    val_files: list[str],
    model_dir: Path,
    reward_file: str,
    reward_function: str,
    experiment_name: str,
    scale: ModelScale | None = None,
    sft_train_files: list[str] = (),
) -> dict[str, Any]:
    """The settings written to recipe.yaml: this task's data, model, reward and lengths, and the SFT
    and GRPO numbers of `recipe_numbers(scale)`; the rest keep their defaults. `train_files` are
    GRPO's prompts, `sft_train_files` SFT's rows (empty: the same files). Response room is 1.5 ×
    the longest reference answer on the tiny path; a pretrained chat model gets twice it, at least 32
    tokens, for its words around the answer. SFT runs until held-out accuracy stops rising
    (sft.stop_on_plateau), sft.total_steps being the cap."""
    k = recipe_numbers(scale)
    pretrained = scale is not None and scale.pretrained
    prompt_tokens = _round_up(profile.prompt_tokens["max"])
    longest_answer = profile.answer_tokens.get("max", 16 if pretrained else 32)
    if pretrained:
        response_tokens = max(32, _round_up(2 * longest_answer))
    else:
        response_tokens = _round_up(RESPONSE_HEADROOM * longest_answer)
    actor = {"lr": k.lr} | ({"warmup_steps": k.warmup_steps} if k.warmup_steps is not None else {})
    recipe: dict[str, Any] = {
        "data": {
            "train_files": train_files,
            "val_files": val_files,
            "max_prompt_tokens": prompt_tokens,
            "prompts_per_step": k.prompts_per_step,
        },
        "model": {"path": str(model_dir)},
        "rollout": {"n": 8, "temperature": k.temperature, "max_response_tokens": response_tokens},
        "actor": actor
        | {
            "prompts_per_mini_batch": k.prompts_per_step,
            "trajectories_per_micro_batch": k.trajectories_per_micro_batch,
            "loss_agg_mode": "token-mean",
        },
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {
            "experiment_name": experiment_name,
            "total_steps": k.total_steps,
            "test_freq": k.test_freq,
        },
        "sft": {
            **({"train_files": list(sft_train_files)} if sft_train_files else {}),
            "lr": k.sft_lr,
            "lr_schedule": "constant",
            "warmup_steps": k.sft_warmup_steps,
            "total_steps": k.sft_total_steps,
            "test_freq": k.sft_test_freq if val_files else 0,
            "stop_on_plateau": 3 if val_files else 0,
            "trajectories_per_step": k.sft_per_step,
            "trajectories_per_micro_batch": k.sft_per_step,
            "max_tokens": prompt_tokens + response_tokens,
        },
    }
    if reward_file:
        recipe["reward"] = {"custom_function_path": reward_file, "custom_function_name": reward_function}
    return recipe


def init_task(
    train_files: list[str],
    out_dir: str | Path,
    *,
    val_files: list[str] = (),
    reward_file: str = "",
    reward_function: str = "compute_score",
    size: str = "1m",
    vocab_size: int = 1024,
    seed: int = 0,
    model_path: str = "",
    sft_share: float = SFT_SHARE,
    split_seed: int = 0,
) -> tuple[Path, TaskProfile, list[str]]:
    """Everything of the module docstring; returns (recipe path, profile, warnings). With
    `model_path` (an HF model directory) no tiny model is built: the task is measured with that
    model's tokenizer and the recipe points at it. `sft_share` of the training rows (permuted with
    `split_seed`) go to SFT, the rest to GRPO; 0 or 1: no split. The tokenizer and the measurement
    use every row. Raises ValueError (naming the file or function) when the reward cannot score
    the data."""
    out = Path(out_dir).absolute()
    train_files = [str(Path(f).absolute()) for f in train_files]
    val_files = [str(Path(f).absolute()) for f in val_files]
    if size not in MODEL_PRESETS:
        raise ValueError(f"unknown model size {size!r}; choose one of {', '.join(MODEL_PRESETS)}")
    if reward_file:
        reward_file = str(Path(reward_file).absolute())
        compute_score = load_custom_scorer(reward_file, reward_function)
    else:
        compute_score = default_compute_score
    corpus = corpus_from_parquet([*train_files, *val_files])
    if model_path:
        model_dir = Path(model_path).absolute()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    else:
        model_dir = out / "model"
        tokenizer = train_tokenizer(corpus, vocab_size=vocab_size)  # the model's, trained again below
    if not reward_file:
        _check_registered(train_files, val_files, tokenizer)
    profile = profile_task(train_files, tokenizer, compute_score)
    scale = ModelScale.of(model_dir) if model_path else None
    profile.model = scale.line() if scale else ""
    profile.split = split_rows(train_files, out, sft_share, split_seed)
    split = profile.split
    recipe = starter_recipe(
        profile,
        train_files=[split.rl_file] if split else train_files,
        sft_train_files=[split.sft_file] if split else [],
        val_files=val_files,
        model_dir=model_dir,
        reward_file=reward_file,
        reward_function=reward_function,
        experiment_name=out.name,
        scale=scale,
    )
    # The position table holds prompt + response (at least the factory's 512).
    positions = max(
        512, _round_up(recipe["data"]["max_prompt_tokens"] + recipe["rollout"]["max_response_tokens"], 64)
    )
    if not model_path:
        build_tiny_model(
            model_dir, size=size, corpus_texts=corpus, seed=seed, vocab_size=vocab_size,
            max_position_embeddings=positions,
        )  # fmt: skip
    warnings = []
    if profile.answer_score is not None and profile.answer_score < 0.99:
        warnings.append(
            f"the reference answers score {profile.answer_score:.3f} on average under the reward: a "
            "correct response should score 1 — check the reward function against extra_info.answer"
        )
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recipe.yaml"
    header = ["# Written by `stratarl init` from the measured task (docs/own_task.md); edit freely."]
    header += [f"# {line}" for line in profile.lines()]
    path.write_text("\n".join(header) + "\n" + yaml.safe_dump(recipe, sort_keys=False))
    return path, profile, warnings


def _check_registered(train_files: list[str], val_files: list[str], tokenizer: Any) -> None:
    for files in (train_files, val_files):
        if not files:
            continue
        dataset = load_prompt_dataset(files, tokenizer, max_prompt_tokens=100_000)
        unknown = sorted({it.data_source for it in dataset.items} - set(SCORERS))
        if unknown:
            raise ValueError(
                f"data_source {', '.join(map(repr, unknown))} in {', '.join(files)} has no built-in reward "
                f"function (registered: {', '.join(sorted(SCORERS))}); give your scorer with --reward FILE"
            )
