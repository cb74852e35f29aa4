"""Layer 1, config: what does this run do?

Typed dataclasses per concept (data, model, rollout, actor, reference, critic, algorithm, reward,
trainer, cluster, sft), YAML recipes that hold overrides only, dotted CLI overrides, validation that
names the offending keys, and the batch plan printed at start-up."""

from stratarl.config.batch_plan import BatchPlan, batch_size_problems
from stratarl.config.errors import ConfigError, ConfigProblem
from stratarl.config.loading import load_config, save_resolved_config, to_yaml
from stratarl.config.schema_algorithm import AlgorithmConfig, KLControlConfig
from stratarl.config.schema_data import DataConfig, ModelConfig, RewardConfig
from stratarl.config.schema_run import ClusterConfig, RunConfig, SFTConfig, TrainerConfig
from stratarl.config.schema_training import (
    ActorConfig,
    CriticConfig,
    PolicyLossConfig,
    ReferenceConfig,
    RolloutConfig,
    ValidationSamplingConfig,
)
from stratarl.config.validation import config_warnings, validate_config

__all__ = [
    "ActorConfig",
    "AlgorithmConfig",
    "BatchPlan",
    "ClusterConfig",
    "ConfigError",
    "ConfigProblem",
    "CriticConfig",
    "DataConfig",
    "KLControlConfig",
    "ModelConfig",
    "PolicyLossConfig",
    "ReferenceConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "TrainerConfig",
    "ValidationSamplingConfig",
    "batch_size_problems",
    "config_warnings",
    "load_config",
    "save_resolved_config",
    "to_yaml",
    "validate_config",
]
