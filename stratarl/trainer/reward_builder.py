"""Layer 2, control flow: the builder of the run's reward — config `reward.*` to a `RewardManager`.

Kept beside `builders` (config stops here too): the rule scorer's worker processes, the reward
model's worker (its own Ray actor on the Ray backend), the remote reward and the overlong penalty.
"""

from __future__ import annotations

from stratarl.cluster.reward_worker import RayRewardModel, RewardModelSpec, RewardModelWorker
from stratarl.config import RunConfig
from stratarl.reward.manager import InProcessScorer, OverlongSettings, RewardManager
from stratarl.reward.process_pool import ScoringPool
from stratarl.reward.remote import RemoteScorer
from stratarl.trainer.builders import build_compute_score


def build_reward(cfg: RunConfig) -> RewardManager:
    """The run's reward sources (`reward.*`): the rule scorer in worker processes (in this process with
    reward.in_process), the reward model (its own worker; a Ray actor with cluster.backend=ray: call
    this after the policy, whose group joined or started Ray), the remote reward, the overlong
    penalty. Scoring workers start here."""
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
        model = build_reward_model(cfg) if r.model.enable else None
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


def build_reward_model(cfg: RunConfig) -> RewardModelWorker | RayRewardModel:
    """`reward.model.*` as one worker in this process, or as a Ray actor holding the same worker."""
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
    return RayRewardModel(
        spec,
        num_cpus=m.cpus,
        num_gpus=m.gpus,
        threads=cfg.cluster.threads_per_worker or 1,
        call_timeout_s=cfg.cluster.call_timeout_s,
    )
