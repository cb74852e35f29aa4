"""The reward model on Ray: a rank process on the plan's reward_model pool, scoring like one process,
listed in placement.json and armed for stack dumps; one that raises, or cannot load, is a
`WorkerError` naming role `reward_model` and the phase."""

from __future__ import annotations

import json
import os

import pytest
import torch

ray = pytest.importorskip("ray")

from stratarl.cluster.placement import WorkerSizes, make_plan  # noqa: E402
from stratarl.cluster.ranks import WorkerError  # noqa: E402
from stratarl.cluster.ray_cluster import start_or_join  # noqa: E402
from stratarl.cluster.ray_policy_group import start_policy_group  # noqa: E402
from stratarl.cluster.ray_reward_model import (  # noqa: E402
    RayRewardModel,
    start_reward_model,
    start_reward_model_beside,
)
from stratarl.cluster.reward_worker import RewardModelSpec, RewardModelWorker  # noqa: E402
from stratarl.data.tasks.arithmetic import make_arithmetic_dataset  # noqa: E402
from stratarl.data.tiny_models import build_tiny_model, build_tiny_reward_model  # noqa: E402
from stratarl.data.tokenizer_factory import corpus_from_parquet  # noqa: E402
from stratarl.run_directory.run_summary import write_placement  # noqa: E402
from tests.cluster.test_ray_training import spec  # noqa: E402,F401  (module fixture: the tiny policy)

pytestmark = pytest.mark.ray
ROLES = ["actor", "rollout", "reward_model"]
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}],
    [{"role": "user", "content": "What is 4 + 4?"}, {"role": "assistant", "content": "9, I think"}],
]


@pytest.fixture(scope="module")
def rm_spec(tmp_path_factory):
    root = tmp_path_factory.mktemp("reward_model")
    data = make_arithmetic_dataset(root / "data", n_train=16, n_test=2, digits=1, seed=0)
    tokenizer = build_tiny_model(root / "lm", size="1m", corpus_texts=corpus_from_parquet([data["train"]]))
    path = build_tiny_reward_model(root / "rm", tokenizer_dir=tokenizer, seed=3)
    return RewardModelSpec(path=str(path), kind="sequence_classification")


@pytest.fixture(scope="module")
def cluster():
    os.environ.pop("RAY_ADDRESS", None)
    session = start_or_join(None, num_cpus=2)  # a private local cluster
    yield
    session.shutdown()


def test_it_scores_on_its_bundle_is_listed_and_armed(cluster, spec, rm_spec, tmp_path):  # noqa: F811
    # One training rank (1 CPU) and the reward model (1 CPU): the plan's pools take the whole cluster.
    plan = make_plan("colocated", WorkerSizes(training_workers=1), ROLES)
    policy = start_policy_group(spec, plan, call_timeout_s=120)
    try:
        assert ray.available_resources().get("CPU", 0.0) == 0.0  # both pools reserved with the plan
        model = start_reward_model_beside(policy, rm_spec)  # so it can only run on its own bundle
        assert isinstance(model, RayRewardModel)
        expected = RewardModelWorker(rm_spec).score_conversations(CONVERSATIONS)
        torch.testing.assert_close(model.score_conversations(CONVERSATIONS), expected, atol=1e-6, rtol=1e-6)

        write_placement(tmp_path, policy, None)
        placement = json.loads((tmp_path / "placement.json").read_text())
        assert (
            placement["reward_model"] == model.placement()["reward_model"] == placement["actor"]
        )  # one node

        (line,) = model.arm_stack_dumps(tmp_path / "hang")
        assert line.startswith("reward_model rank 0: pid ")
        (dumped,) = model.dump_stacks(tmp_path / "hang" / "now", "a test asked")
        assert dumped.startswith("reward_model rank 0") and "stacks in" in dumped, dumped
        (stacks,) = (tmp_path / "hang" / "now").glob("stacks-reward_model-rank0-*.txt")
        assert "File " in stacks.read_text()  # faulthandler's frames of the rank process

        with pytest.raises(WorkerError) as caught:  # a conversation the worker cannot read: it raises there
            model.score_conversations([CONVERSATIONS[0], None])
        error = caught.value
        assert error.role == "reward_model" and error.phase == "reward_model.score" and error.ranks == [0]
        assert error.reasons[0].startswith("raised TypeError"), error.reasons
        assert str(error).startswith("reward_model worker group failed in phase 'reward_model.score': rank 0")
        (report,) = (tmp_path / "hang").glob("reward_model-reward_model_score-*/report.json")  # the doctor's
        assert json.loads(report.read_text())["role"] == "reward_model"
        with pytest.raises(WorkerError, match="not called"):  # stopped, not left half-alive
            model.score_conversations(CONVERSATIONS)
        model.close()
    finally:
        policy.shutdown()


def test_a_reward_model_that_cannot_load_is_a_worker_error_in_init(cluster, rm_spec, tmp_path):
    broken = RewardModelSpec(path=str(tmp_path), kind="sequence_classification")  # no model there
    plan = make_plan("colocated", WorkerSizes(), ["actor", "rollout", "reward_model"])
    with pytest.raises(WorkerError) as caught:
        start_reward_model(broken, plan, call_timeout_s=120)
    assert caught.value.role == "reward_model" and caught.value.phase == "init"
    assert caught.value.reasons[0].startswith("raised"), caught.value.reasons
    model = start_reward_model(rm_spec, plan, call_timeout_s=120)  # its pool was released: it fits again
    try:
        assert model.score_conversations(CONVERSATIONS).shape == (2,)
    finally:
        model.close()
