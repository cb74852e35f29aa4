"""Assembly: the run's reward — config `reward.*` to a `RewardManager`.

The rule scorer (a custom function by file path, else the registry keyed by data_source) and its
worker processes, the reward model's worker (on the Ray backend a rank process on the reward
model's pool of the policy's placement plan), the remote reward and the overlong penalty.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from stratarl.cluster.reward_worker import RewardModelSpec, RewardModelWorker
from stratarl.cluster.worker_group import PolicyWorkerGroup
from stratarl.config import RunConfig
from stratarl.reward.custom import load_custom_scorer
from stratarl.reward.manager import InProcessScorer, OverlongSettings, RewardManager
from stratarl.reward.process_pool import ScoringPool
from stratarl.reward.registry import default_compute_score
from stratarl.reward.remote import RemoteScorer

if TYPE_CHECKING:
    from stratarl.cluster.ray_reward_model import RayRewardModel


def build_compute_score(cfg: RunConfig):
    """The reward function: a custom one by file path, else the registry keyed by data_source."""
    r = cfg.reward
    if r.custom_function_path:
        return load_custom_scorer(Path(r.custom_function_path), r.custom_function_name, **r.function_kwargs)
    return default_compute_score


def build_reward(cfg: RunConfig, policy: PolicyWorkerGroup | None = None) -> RewardManager:
    """The run's reward sources (`reward.*`): the rule scorer in worker processes (in this process with
    reward.in_process), the reward model (`build_reward_model`; with cluster.backend=ray it needs
    `policy`, the policy's worker group, whose plan reserved its pool), the remote reward, the
    overlong penalty. Scoring workers start here."""
    r = cfg.reward
    rule: InProcessScorer | ScoringPool | None = None
    if r.rule_weight != 0:
        compute_score = build_compute_score(cfg)
        rule = (
            InProcessScorer(compute_score)
            if r.in_process
            else ScoringPool(
                compute_score,
                num_workers=r.num_workers,
                timeout_s=r.timeout_s,
                max_output_bytes=r.max_output_bytes,
            )
        )
    try:
        model = build_reward_model(cfg, policy) if r.model.enable else None
    except BaseException:
        if rule is not None:
            rule.close()
        raise
    rr, o = r.remote, r.overlong_buffer
    remote = (
        RemoteScorer(
            rr.url,
            requests_per_second=rr.requests_per_second,
            burst=rr.burst,
            max_retries=rr.max_retries,
            backoff_s=rr.backoff_s,
            timeout_s=rr.timeout_s,
        )
        if rr.url
        else None
    )
    overlong = (
        OverlongSettings(cfg.rollout.max_response_tokens, o.len, o.penalty_factor) if o.enable else None
    )
    return RewardManager(
        rule,
        rule_weight=r.rule_weight,
        model=model,
        model_weight=r.model.weight,
        remote=remote,
        remote_weight=rr.weight,
        remote_concurrency=rr.max_concurrency,
        overlong=overlong,
        failure_score=r.failure_score,
    )


def build_reward_model(
    cfg: RunConfig, policy: PolicyWorkerGroup | None = None
) -> RewardModelWorker | RayRewardModel:
    """`reward.model.*` as one `RewardModelWorker` in this process (cluster.backend=in-process), or
    as a Ray rank process holding the same worker on the reward model's pool, which the policy group
    (`policy`, built first) reserved with its plan (`roles.placement_plan`)."""
    m = cfg.reward.model
    spec = RewardModelSpec(
        path=m.path,
        kind=m.kind,
        tokenizer_path=m.tokenizer_path,
        dtype=m.dtype,
        batch_size=m.trajectories_per_micro_batch,
        judge_template=m.judge_template,
        judge_yes=m.judge_yes,
        judge_no=m.judge_no,
        device="cuda" if m.gpus > 0 else "cpu",
    )
    if cfg.cluster.backend == "in-process":
        return RewardModelWorker(spec)
    from stratarl.cluster.ray_reward_model import start_reward_model_beside

    if getattr(policy, "deployment", None) is None:
        raise TypeError(
            "cluster.backend=ray: the reward model's process goes on the pool the policy's plan "
            f"reserved; build the policy first and pass it as policy= (got {type(policy).__name__})"
        )
    return start_reward_model_beside(policy, spec)
