"""Layer 1, config: the run as a whole — `trainer.*`, `cluster.*`, `sft.*` — and `RunConfig`, the root.

`RunConfig` holds one group per concept; a recipe YAML and CLI overrides change only what they name.
"""

from __future__ import annotations

from dataclasses import dataclass

from stratarl.config.schema_agent import AgentConfig
from stratarl.config.schema_algorithm import AlgorithmConfig
from stratarl.config.schema_async import TRAINER_MODES, AsyncTrainingConfig
from stratarl.config.schema_data import DataConfig, ModelConfig, RewardConfig
from stratarl.config.schema_distillation import DistillationConfig
from stratarl.config.schema_observe import TraceConfig, WatchdogConfig
from stratarl.config.schema_training import (
    LR_SCHEDULES,
    ActorConfig,
    CriticConfig,
    ReferenceConfig,
    RolloutConfig,
)
from stratarl.config.setting import section, setting

LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
RESUME_MODES = ("auto", "disable", "resume_path")


@dataclass
class TrainerConfig:
    """The loop: how long, how often to validate and save, where outputs go, how to log."""

    total_steps: int | None = setting(
        None,
        "training steps (one batch of prompts each); null: total_epochs × steps per epoch",
        verl="trainer.total_training_steps",
    )
    total_epochs: int = setting(
        1, "passes over the training prompts when total_steps is null", verl="trainer.total_epochs"
    )
    test_freq: int = setting(10, "validate every this many steps; ≤ 0: never", verl="trainer.test_freq")
    save_freq: int = setting(
        0,
        "save a checkpoint every this many steps (and at the last step); ≤ 0: never",
        verl="trainer.save_freq",
    )
    resume_mode: str = setting(
        "auto",
        "auto: continue the run in run_dir from its newest complete checkpoint (an empty run_dir starts "
        "one); disable: start a run, only in an empty run_dir; resume_path: continue from "
        "trainer.resume_from_path",
        verl="trainer.resume_mode",
        choices=RESUME_MODES,
    )
    resume_from_path: str = setting(
        "", "a global_step_N checkpoint directory (resume_mode=resume_path)", verl="trainer.resume_from_path"
    )
    resume_allow_changes: list[str] = setting(
        [],
        "settings a resume may change from the run's saved config.yaml, e.g. [actor.lr, "
        "trainer.total_steps]; a resume that changes others is refused, listing them",
    )
    overwrite: bool = setting(
        False,
        "start a new run in a run_dir that holds another one, after moving that one aside to "
        "<run_dir>.old-<time>",
    )
    max_checkpoints_to_keep: int | None = setting(
        None, "newest complete checkpoints kept; null: all", verl="trainer.max_actor_ckpt_to_keep"
    )
    val_before_train: bool = setting(
        True, "validate once before the first step", verl="trainer.val_before_train"
    )
    val_only: bool = setting(False, "validate once and stop (no training)", verl="trainer.val_only")
    seed: int = setting(0, "seed of everything random (sampling, init, shuffling)")
    output_root: str = setting("runs", "folder under which run directories are created")
    run_dir: str = setting(
        "",
        "this run's directory; empty: <output_root>/<project_name>/<experiment_name>",
        verl="trainer.default_local_dir",
    )
    project_name: str = setting(
        "stratarl", "project name for loggers and the run directory", verl="trainer.project_name"
    )
    experiment_name: str = setting(
        "grpo", "experiment name for loggers and the run directory", verl="trainer.experiment_name"
    )
    logger: list[str] = setting(
        ["console", "jsonl"],
        "where metrics go besides metrics.jsonl, the run's own record, written whether jsonl is "
        "listed or not (resume, the summary, the curves and the doctor read it): console (a line per "
        "step), tensorboard (<run_dir>/tensorboard), wandb (offline, <run_dir>/wandb; `wandb sync` "
        "uploads it)",
        verl="trainer.logger",
        choices=LOGGERS,
    )
    save_trajectories: bool = setting(True, "write one JSONL record per trajectory into the run directory")
    mode: str = setting(
        "sync",
        "when generation runs: sync (then training), one_step_off (step k+1's batch generated while "
        "step k trains), async (a producer fills a bounded buffer; async_training.*) — docs/async.md",
        verl="trainer.v1.trainer_mode",
        choices=TRAINER_MODES,
    )


@dataclass
class ClusterConfig:
    """Where the roles run: in this process, or as Ray actors."""

    backend: str = setting("in-process", "how workers are hosted", choices=("in-process", "ray"))
    device: str = setting(
        "auto",
        "where models and batches are placed; auto: cuda when this process sees CUDA (in-process) or "
        "the training workers reserve GPUs (ray), else cpu; cuda without CUDA is refused",
        verl="trainer.device",
        choices=("auto", "cpu", "cuda"),
    )
    num_cpus: int | None = setting(
        None, "CPUs given to Ray; null: all visible", verl="ray_kwargs.ray_init.num_cpus"
    )
    threads_per_worker: int | None = setting(
        None,
        "torch intra-op threads of each worker process (in-process: of this process); null: torch's "
        "default in-process, the worker's CPU share on Ray",
    )
    host_allocator: str = setting(
        "keep",
        "freed host memory in the processes that train: keep (glibc keeps every freed block for reuse, "
        "so CPU activations above 32 MiB stop page-faulting on each pass; resident memory stays at its "
        "peak) or system (glibc's defaults); stratarl/engine/host_memory.py",
        choices=("keep", "system"),
    )
    address: str | None = setting(
        None,
        "Ray cluster to join (backend=ray), e.g. 10.0.0.1:6379; null: start a private local cluster",
        verl="ray_kwargs.ray_init.address",
    )
    placement: str = setting(
        "colocated",
        "colocated: each training worker also hosts rollout and reference; split: rollout on its own pool",
        choices=("colocated", "split"),
    )
    training_workers: int = setting(
        1,
        "data-parallel training processes (FSDP2 ranks) of the actor; a critic gets as many, one beside each",
        verl="trainer.n_gpus_per_node",
    )
    rollout_replicas: int = setting(1, "rollout engine processes of the split placement")
    cpus_per_training_worker: float = setting(1.0, "CPUs reserved per training process (≤ 1 or whole)")
    cpus_per_rollout_replica: float = setting(1.0, "CPUs reserved per rollout replica (≤ 1 or whole)")
    gpus_per_training_worker: float = setting(0.0, "GPUs reserved per training process")
    gpus_per_rollout_replica: float = setting(0.0, "GPUs reserved per rollout replica")
    call_timeout_s: float = setting(
        600.0, "a remote call not answered within this many seconds stops the run, naming role, rank, phase"
    )
    transfer_queue_units: int = setting(
        2,
        "storage units of the TransferQueue that phases' rows pass through on Ray (0: batches travel "
        "through the controller)",
        verl="transfer_queue.backend.SimpleStorage.num_data_storage_units",
    )


@dataclass
class SFTConfig:
    """Supervised warm-start on the RL run's datasets or its own rows (sft.train_files): loss on response
    tokens only.

    Its verl keys are those of verl's separate SFT config (sft_trainer.yaml), not ppo_trainer.yaml.
    """

    train_files: list[str] = setting(
        [],
        "parquet files of SFT's own training rows (each with extra_info.answer), read by stratarl sft "
        "only; empty: data.train_files, the RL run's prompts. Other rows than data.train_files give GRPO "
        "prompts SFT did not train on (stratarl init can split the rows so: stratarl/apps/task_init.py, "
        "SFT_SHARE; not by default, docs/own_task.md measures why). data.max_train_prompts limits "
        "them alike",
        verl="data.train_files",
    )
    total_epochs: int = setting(
        1, "passes over the training examples when total_steps is null", verl="trainer.total_epochs"
    )
    total_steps: int | None = setting(
        None, "optimizer steps; null: total_epochs × steps per epoch", verl="trainer.total_training_steps"
    )
    lr: float = setting(1e-4, "peak learning rate of AdamW", verl="optim.lr")
    weight_decay: float = setting(0.01, "AdamW weight decay", verl="optim.weight_decay")
    warmup_steps: int = setting(0, "optimizer steps of linear LR warm-up", verl="optim.lr_warmup_steps")
    lr_schedule: str = setting("cosine", "LR after warm-up", verl="optim.lr_scheduler", choices=LR_SCHEDULES)
    min_lr_ratio: float = setting(0.0, "cosine schedule ends at lr · min_lr_ratio", verl="optim.min_lr_ratio")
    grad_clip: float = setting(1.0, "max global grad norm", verl="optim.clip_grad")
    trajectories_per_step: int = setting(
        32, "examples (prompt + response) per optimizer step", verl="data.train_batch_size"
    )
    trajectories_per_micro_batch: int = setting(
        32, "examples per forward/backward pass", verl="data.micro_batch_size_per_gpu"
    )
    max_tokens: int = setting(
        1024,
        "longest example in tokens (prompt + response + EOS); a longer one is refused, naming its row",
        verl="data.max_length",
    )
    test_freq: int = setting(
        0,
        "held-out accuracy on data.val_files (and its generations) every this many steps, besides before "
        "and after training; 0: before and after only",
    )
    stop_on_plateau: int = setting(
        0,
        "stop once this many held-out evaluations in a row (every sft.test_freq steps) beat the best "
        "accuracy so far by less than sft.plateau_delta; the planned steps are then a cap; 0: never",
    )
    plateau_delta: float = setting(
        0.01, "the absolute gain in held-out accuracy that counts as progress for sft.stop_on_plateau"
    )


@dataclass
class RunConfig:
    """Everything one run does. Load with `load_config(recipe, overrides)`; check with `validate_config`."""

    data: DataConfig = section(DataConfig, "prompt datasets")
    model: ModelConfig = section(ModelConfig, "the policy model")
    rollout: RolloutConfig = section(RolloutConfig, "generation")
    agent: AgentConfig = section(AgentConfig, "multi-turn agent rollout: tools, interactions, turn limits")
    actor: ActorConfig = section(ActorConfig, "the policy update")
    reference: ReferenceConfig = section(ReferenceConfig, "the frozen reference policy")
    critic: CriticConfig = section(CriticConfig, "the value model (PPO)")
    distillation: DistillationConfig = section(
        DistillationConfig, "on-policy distillation from a frozen teacher"
    )
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "advantages and reward shaping")
    reward: RewardConfig = section(RewardConfig, "scoring")
    trainer: TrainerConfig = section(TrainerConfig, "the training loop and its outputs")
    async_training: AsyncTrainingConfig = section(
        AsyncTrainingConfig, "the producer of trainer.mode=one_step_off / async"
    )
    cluster: ClusterConfig = section(ClusterConfig, "process placement")
    sft: SFTConfig = section(SFTConfig, "supervised warm-start")
    trace: TraceConfig = section(TraceConfig, "the per-trajectory trace (`stratarl trace`)")
    watchdog: WatchdogConfig = section(WatchdogConfig, "phase deadlines and stack dumps (`stratarl doctor`)")

    @property
    def uses_critic(self) -> bool:
        """True when a critic is trained: critic.enable, or (when null) an estimator that needs values."""
        if self.critic.enable is not None:
            return self.critic.enable
        # The catalog, not the registry: loading a config does not import torch.
        from stratarl.algo.catalog import ESTIMATOR_INPUTS

        return "values" in ESTIMATOR_INPUTS.get(self.algorithm.adv_estimator, frozenset())

    @property
    def uses_reference(self) -> bool:
        """True when a frozen reference policy is needed: a KL loss or an in-reward KL penalty."""
        return self.actor.use_kl_loss or self.algorithm.use_kl_in_reward
