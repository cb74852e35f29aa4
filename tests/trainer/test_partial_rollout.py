"""trainer.mode=async with async_training.partial_rollout=continue in one process: weight pushes land
in the batch being generated, so responses span versions; every token's recorded log-prob is the one
of the weights its recorded version names, staleness (counted from a row's oldest token) stays within
the bound, the partial rows are counted, and a resume from a checkpoint trains the saved buffer."""

import json

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM

from stratarl.config import ConfigError, validate_config
from stratarl.observe.trace_fields import weight_version_spans
from tests.trainer.test_rl_trainer import small_config
from tests.trainer.test_training_modes import mode_config, train

STEPS = 5
# Long fixed-length responses decoded two at a time: the batch of step s + 1 (which may start once
# step s trains) takes longer than step s, so the push after step s meets it mid-generation.
CONTINUE = [
    "async_training.partial_rollout=continue",
    "async_training.max_staleness=1",
    "rollout.max_response_tokens=32",
    "rollout.ignore_eos=true",
    "rollout.trajectories_per_generate_batch=2",
    f"trainer.total_steps={STEPS}",
]


def token_log_probs(model, prompt_ids, response_ids, temperature) -> torch.Tensor:
    """[T] log π(response_t | prompt, response_<t) by one forward."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt_ids) :, None])[:, 0]


def per_token_versions(spans, length) -> list[int]:
    ends = [start for start, _ in spans[1:]] + [length]
    return [v for (start, v), end in zip(spans, ends, strict=True) for _ in range(end - start)]


def test_continue_lands_pushes_mid_generation_and_records_each_tokens_version(task, tmp_path):
    run = tmp_path / "run"
    config = mode_config(task, tmp_path, "async", *CONTINUE, "trainer.save_freq=1")
    train_records, _, trajectories = train(config, run)
    assert [r["step"] for r in train_records] == list(range(1, STEPS + 1))
    by_step = {r["step"]: r for r in train_records}
    for t in trajectories:
        spans, step = t["weight_version_spans"], t["step"]
        versions = [v for _, v in spans]
        assert spans[0] == [0, t["weight_version"]]  # a row's version is its oldest token's
        assert versions == sorted(set(versions))  # each version once, in order
        assert step - 1 - versions[0] <= 1  # the bound, counted from the oldest token
        assert versions[-1] <= step - 1  # no token is newer than the weights that train it
    for step, r in by_step.items():
        rows = [t for t in trajectories if t["step"] == step]
        assert r["async/partial_rows"] == sum(len(t["weight_version_spans"]) > 1 for t in rows)
        assert 0 <= r["async/token_staleness_max"] <= r["async/staleness_max"] <= 1
        assert r["async/token_staleness_mean"] <= r["async/staleness_mean"] + 1e-12
        assert "rollout_corr/rollout_is_mean" in r  # the decoupled correction, per token
    partial = sum(r["async/partial_rows"] for r in train_records)
    assert partial > 0, "no push met a batch mid-generation"

    # every token's rollout log-prob is its recorded version's (versions v ≥ 1: global_step_v's weights)
    weights = {0: task["model"]} | {
        v: run / "checkpoints" / f"global_step_{v}" / "huggingface" for v in range(1, STEPS)
    }
    models = {v: AutoModelForCausalLM.from_pretrained(path).eval() for v, path in weights.items()}
    checked = 0
    for step in range(2, STEPS + 1):
        for row in pq.read_table(run / "traces" / f"step_{step:06d}.parquet").to_pylist():
            spans = row["weight_version_spans"]
            if len(spans) < 2:
                continue
            length = row["action_tokens"]
            versions = torch.tensor(per_token_versions(spans, length))
            by_version = {
                v: token_log_probs(
                    models[v], row["prompt_ids"], row["response_ids"], config.rollout.temperature
                )
                for v in set(versions.tolist())
            }
            mixed = torch.stack([by_version[int(v)][i] for i, v in enumerate(versions)]).mean().item()
            oldest = by_version[int(versions[0])].mean().item()
            recorded = row["rollout_log_prob_mean"]
            assert abs(mixed - recorded) < 1e-4, (step, mixed, recorded)
            assert abs(oldest - recorded) > 10 * abs(mixed - recorded)  # the newer weights did sample
            checked += 1
    assert checked > 0


@pytest.mark.slow  # ~26 s; async resume with a saved buffer runs by default in test_training_modes.py
def test_continue_resumes_from_its_checkpoint_with_the_buffer_it_saved(task, tmp_path):
    """A checkpoint still holds the producer (the batch in flight finishes): the saved batches, whose
    rows may span versions, are trained first by the resumed run, with the versions they recorded."""
    extra = [*CONTINUE[:5], "trainer.total_steps=4", "trainer.save_freq=2"]
    first, _, _ = train(mode_config(task, tmp_path, "async", *extra), tmp_path / "run")
    assert [r["step"] for r in first] == [1, 2, 3, 4]
    state = torch.load(
        tmp_path / "run" / "checkpoints" / "global_step_4" / "trainer_state.pt", weights_only=False
    )
    saved = state["batches"]["ready"]
    assert [b.step for b in saved] == list(range(5, 5 + len(saved)))
    longer = ["trainer.total_steps=6", "trainer.resume_allow_changes=[trainer.total_steps]"]
    resumed, _, trajectories = train(mode_config(task, tmp_path, "async", *extra, *longer), tmp_path / "run")
    assert [r["step"] for r in resumed] == list(range(1, 7))
    assert all(r["async/staleness_max"] <= 1 for r in resumed)
    for batch in saved:  # trained at its step as generated before the checkpoint, token versions too
        rows = [t for t in trajectories if t["step"] == batch.step]
        assert [t["uid"] for t in rows] == [str(u) for u in batch.item.batch["uid"]]
        assert min(t["weight_version"] for t in rows) == batch.version
        expected = [json.loads(json.dumps(s)) for s in weight_version_spans(batch.item.batch)]
        assert [t["weight_version_spans"] for t in rows] == expected


@pytest.mark.parametrize(
    ("overrides", "keys"),
    [
        (["async_training.partial_rollout=continue"], "async_training.partial_rollout, trainer.mode"),
        (
            ["async_training.partial_rollout=continue", "trainer.mode=one_step_off"],
            "async_training.partial_rollout, trainer.mode",
        ),
        (
            ["async_training.partial_rollout=continue", "trainer.mode=async", "rollout.backend=vllm"],
            "async_training.partial_rollout, rollout.backend",
        ),
        (
            ["async_training.partial_rollout=continue", "trainer.mode=async", "cluster.backend=ray"],
            "async_training.partial_rollout, cluster.placement",
        ),
        (
            [
                "async_training.partial_rollout=continue",
                "trainer.mode=async",
                "async_training.deterministic=true",
            ],
            "async_training.partial_rollout, async_training.deterministic",
        ),
        (["async_training.partial_rollout=abort"], "async_training.partial_rollout"),
    ],
)
def test_unbuilt_partial_rollout_combinations_are_refused_naming_the_keys(task, overrides, keys):
    with pytest.raises(ConfigError) as error:
        validate_config(small_config(task, *overrides))
    assert keys in str(error.value)
