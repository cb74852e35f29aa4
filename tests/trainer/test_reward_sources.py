"""Reward models from a recipe: a tiny sequence-classification RM, a causal-LM judge and a loopback
HTTP reward, summed with the rule scorer and DAPO's overlong penalty in short real training runs; each
trajectory record shows every source's part, and bad reward settings fail validation naming the key."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from stratarl.config import ConfigError, validate_config
from stratarl.data.schema import read_rows
from stratarl.data.tiny_models import build_tiny_reward_model
from stratarl.observe.run_log import read_metrics
from stratarl.reward import arithmetic
from stratarl.reward.manager import RewardInputs, RewardManager
from stratarl.reward.remote import RemoteScorer
from stratarl.reward.reward_model import SequenceRewardModel
from stratarl.trainer.rl_trainer import RLTrainer
from tests.trainer.test_rl_trainer import small_config

TWO_STEPS = ["trainer.total_steps=2", "trainer.test_freq=2", "data.max_val_prompts=4"]


@pytest.fixture(scope="module")
def reward_model(task):
    return build_tiny_reward_model(task["root"] / "rm", tokenizer_dir=task["model"], seed=3)


def train(config, run_dir):
    RLTrainer(config, run_dir).fit()
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "train"]
    records = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    return train, records


def conversation(task, record):
    """The conversation the reward model read: the dataset row's prompt, then the scored response."""
    prompt = read_rows(task["train"])[record["source_row"]]["prompt"]
    return [*map(dict, prompt), {"role": "assistant", "content": record["response"]}]


def independent_rm_scores(path, conversations):
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    return SequenceRewardModel(model, AutoTokenizer.from_pretrained(path)).score_conversations(conversations)


def overlong(length, budget=8, buffer=4):
    return min(-(length - (budget - buffer)) / buffer, 0.0)


def test_rule_plus_reward_model_plus_overlong_penalty(task, reward_model, tmp_path):
    config = small_config(
        task,
        *TWO_STEPS,
        "reward.model.enable=true",
        f"reward.model.path={reward_model}",
        "reward.model.weight=0.5",
        "reward.overlong_buffer.enable=true",
        "reward.overlong_buffer.len=4",
    )
    metrics, records = train(config, tmp_path / "run")
    assert [r["step"] for r in metrics] == [1, 2]
    assert all("reward/rm_score/mean" in r and "reward/overlong/mean" in r for r in metrics)
    expected_rm = independent_rm_scores(reward_model, [conversation(task, r) for r in records])
    for record, rm in zip(records, expected_rm.tolist(), strict=True):
        parts = record["reward_sources"]
        rule = arithmetic.compute_score(
            "arithmetic",
            record["response"],
            read_rows(task["train"])[record["source_row"]]["reward_model"]["ground_truth"],
        )["score"]
        assert parts["rule_score"] == pytest.approx(rule)
        assert parts["rm_score"] == pytest.approx(0.5 * rm, abs=1e-5)
        assert parts["overlong_reward"] == pytest.approx(overlong(record["response_tokens"]))
        assert record["reward"] == pytest.approx(sum(parts.values()), abs=1e-5)
    assert len({round(r["reward_sources"]["rm_score"], 6) for r in records}) > 1  # a real forward per row


def test_a_causal_lm_judge_alone(task, tmp_path):
    config = small_config(
        task,
        *TWO_STEPS,
        "reward.rule_weight=0",
        "reward.model.enable=true",
        f"reward.model.path={task['model']}",
        "reward.model.kind=causal_lm_judge",
        "reward.model.judge_yes='1'",
        "reward.model.judge_no='0'",
    )
    _, records = train(config, tmp_path / "run")
    for record in records:
        assert set(record["reward_sources"]) == {"rm_score"}
        assert 0.0 < record["reward"] == record["reward_sources"]["rm_score"] < 1.0  # P(yes) among {yes, no}


class LoopbackReward:
    """A reward server on 127.0.0.1: score = len(solution_str) / 10; the first request gets a 503."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                if len(owner.requests) == 1:
                    self.send_response(503)
                    self.end_headers()
                    return
                reply = json.dumps({"score": len(body["solution_str"]) / 10}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_rule_plus_a_remote_reward_over_loopback_http(task, tmp_path):
    server = LoopbackReward()
    try:
        config = small_config(
            task,
            *TWO_STEPS,
            f"reward.remote.url={server.url}",
            "reward.remote.weight=2.0",
            "reward.remote.requests_per_second=200",
            "reward.remote.burst=8",
            "reward.remote.backoff_s=0.05",
        )
        metrics, records = train(config, tmp_path / "run")
    finally:
        server.close()
    assert all(r["reward/failures/total"] == 0 for r in metrics)  # the 503 was retried
    scored = 2 * 16 + 2 * 4  # two steps of B·n = 16; 4 validation prompts before step 1 and after step 2
    assert len(server.requests) == scored + 1
    assert {"data_source", "solution_str", "ground_truth", "extra_info"} <= server.requests[-1].keys()
    for record in records:
        parts = record["reward_sources"]
        assert parts["remote_score"] == pytest.approx(2.0 * len(record["response"]) / 10)
        assert record["reward"] == pytest.approx(parts["rule_score"] + parts["remote_score"], abs=1e-6)


def test_a_failing_remote_reward_is_counted_and_scored_as_configured():
    inputs = RewardInputs(["d", "d"], ["a", "b"], ["a", "x"], [None, None], [[], []], torch.tensor([1, 1]))
    remote = RemoteScorer("http://127.0.0.1:9/score", max_retries=1, backoff_s=0.01, timeout_s=1.0)
    manager = RewardManager(None, remote=remote, failure_score=-0.5)
    result = manager.score(inputs)
    assert result.scores.tolist() == [-0.5, -0.5]
    assert result.failures == {"remote_URLError": 2}
    assert result.metrics()["reward/failures/d/remote_URLError"] == 2.0
    assert remote.attempts == 4  # each sample: the request and its one retry


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["reward.model.enable=true"], "reward.model.path"),
        (["reward.rule_weight=0"], "reward.rule_weight"),
        (["reward.remote.url=ftp://x"], "reward.remote.url"),
        (
            ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=99"],
            "reward.overlong_buffer.len",
        ),
        (["reward.model.kind=judge"], "reward.model.kind"),
        (["reward.model.enable=true", "reward.model.path=/nowhere"], "reward.model.path"),
        (["reward.num_workers=0"], "reward.num_workers"),
        (["reward.model.enable=true", "reward.model.path=/tmp", "reward.model.gpus=1"], "reward.model.gpus"),
        (  # on Ray its process has a bundle of its own, which cannot be empty
            [
                "reward.model.enable=true",
                "reward.model.path=/tmp",
                "cluster.backend=ray",
                "reward.model.cpus=0",
            ],
            "reward.model.cpus",
        ),
        (  # a share Ray cannot reserve
            [
                "reward.model.enable=true",
                "reward.model.path=/tmp",
                "cluster.backend=ray",
                "reward.model.cpus=1.5",
            ],
            "reward.model.cpus",
        ),
    ],
)
def test_reward_settings_are_validated_naming_the_key(task, overrides, key):
    with pytest.raises(ConfigError) as err:
        validate_config(small_config(task, *overrides))
    assert any(key in problem.keys for problem in err.value.problems), str(err.value)


@pytest.mark.slow
@pytest.mark.ray
def test_the_reward_model_as_its_own_ray_actor(task, reward_model, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    import ray

    from tests.trainer.test_ray_trainer import ray_config

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run_dir = tmp_path / "run"
    # The plan's pools: two 1-CPU training ranks and the reward model's own 1-CPU bundle.
    extra = ["reward.model.enable=true", f"reward.model.path={reward_model}", "cluster.num_cpus=3"]
    trainer = RLTrainer(ray_config(task, run_dir, "colocated", total_steps=2, extra=extra), run_dir)
    actor_class = type(trainer.rewards.model).__name__
    trainer.fit()
    assert actor_class == "RayRewardModel" and not ray.is_initialized()  # the actor and the cluster ended
    placement = json.loads((run_dir / "placement.json").read_text())
    assert len(placement["reward_model"]) == 1 and placement["reward_model"][0] in placement["actor"]
    assert list((run_dir / "hang" / "ranks").glob("stacks-reward_model-rank0-*.txt"))  # armed by the watchdog
    records = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    expected_rm = independent_rm_scores(reward_model, [conversation(task, r) for r in records])
    for record, rm in zip(records, expected_rm.tolist(), strict=True):
        assert record["reward_sources"]["rm_score"] == pytest.approx(rm, abs=1e-5)


def test_a_remote_reward_that_never_answers_times_out_with_the_batch(monkeypatch):
    import socket
    import time

    from stratarl.reward import manager as manager_module

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/score"
    monkeypatch.setattr(manager_module, "remote_deadline_s", lambda remote, n, concurrency: 0.5)
    inputs = RewardInputs(["d", "d"], ["a", "b"], ["a", "x"], [None, None], [[], []], torch.tensor([1, 1]))
    manager = RewardManager(None, remote=RemoteScorer(url, timeout_s=30.0, max_retries=0))
    started = time.monotonic()
    result = manager.score(inputs)
    assert time.monotonic() - started < 3.0
    assert result.failures == {"remote_timeout": 2} and result.scores.tolist() == [0.0, 0.0]
    silent.close()
