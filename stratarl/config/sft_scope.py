"""Layer 1, config: which settings `stratarl sft` reads (`SFT_READS`), and the warnings it prints.

SFT shares its recipe with the RL run that follows it, so most settings are the RL run's: of the
validation warnings, SFT prints those whose keys it all reads, plus its own — no held-out files (no
accuracy before and after), and keys given on its command line that it does not read. A key the
recipe changes for the RL run is not warned about: that is what a shared recipe is for.
"""

from __future__ import annotations

from collections.abc import Sequence

from stratarl.config.schema_run import RunConfig
from stratarl.config.validation import keyed_warnings


def _keys(section: str, names: str) -> set[str]:
    return {f"{section}.{name}" for name in names.split()}


# Every key `stratarl sft` reads (cli._sft, trainer/sft.py's sft_from_config and what it calls):
# the sft.* optimizer, the model and its precision (actor.fsdp), the data, greedy-or-sampled
# evaluation through the rollout engine, the scorer, and the run directory. Some are read only in
# some configs (sft.total_epochs when sft.total_steps is null, rollout.val_kwargs.temperature when
# not greedy, data.train_files when sft.train_files is empty, ...). `stratarl train` reads no sft.*
# setting. tests/trainer/test_sft_reads.py records real runs and compares.
SFT_READS = frozenset().union(
    _keys("sft", "train_files total_epochs total_steps lr weight_decay warmup_steps lr_schedule"),
    _keys("sft", "min_lr_ratio grad_clip"),
    _keys("sft", "trajectories_per_step trajectories_per_micro_batch max_tokens"),
    _keys("sft", "test_freq stop_on_plateau plateau_delta"),
    _keys("model", "path tokenizer_path dtype trust_remote_code gradient_checkpointing"),
    _keys("actor.fsdp", "param_dtype offload_params optimizer_offload reshard_after_forward"),
    _keys("data", "train_files val_files prompt_key data_source_key max_prompt_tokens filter_overlong"),
    _keys("data", "max_train_prompts max_val_prompts"),
    _keys(
        "rollout",
        "backend dtype free_cache_engine max_response_tokens trajectories_per_generate_batch weight_sharing "
        "decode_step",
    ),
    _keys("rollout.val_kwargs", "n greedy temperature top_p top_k"),
    _keys("reward", "custom_function_path custom_function_name function_kwargs"),
    _keys("trainer", "seed logger project_name experiment_name output_root run_dir overwrite resume_mode"),
    _keys("cluster", "backend device threads_per_worker host_allocator"),
    # the device under cluster.backend=ray (SFT itself runs in this process)
    _keys("cluster", "gpus_per_training_worker"),
    # the rollout engine's spec; SFT pushes no weights while a batch is generated
    _keys("async_training", "partial_rollout"),
)


def sft_reads(key: str) -> bool:
    """Whether `stratarl sft` reads `key`, a setting, a key inside a dict setting
    (reward.function_kwargs.x) or a whole section given at once (sft)."""
    return any(key == read or key.startswith(f"{read}.") or read.startswith(f"{key}.") for read in SFT_READS)


def sft_warnings(cfg: RunConfig, overrides: Sequence[str] = ()) -> list[str]:
    """What `stratarl sft` warns about for `cfg` loaded with `overrides` (`key=value` strings)."""
    warnings = [w.message for w in keyed_warnings(cfg) if all(sft_reads(key) for key in w.keys)]
    if not cfg.data.val_files:
        warnings.append(
            "data.val_files is empty: stratarl sft measures no held-out accuracy before or after "
            "training (nan in summary.json)"
        )
    given = dict.fromkeys(item.partition("=")[0].strip().lstrip("+") for item in overrides)
    ignored = [key for key in given if not sft_reads(key)]
    if ignored:
        warnings.append(
            f"{', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} given on the command line but "
            "not read by stratarl sft (it trains with sft.*; the RL settings apply to stratarl train)"
        )
    return warnings
