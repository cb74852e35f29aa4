"""rollout.weight_sharing: an engine that serves the actor's own model generates exactly what an
engine with its own, synced copy generates, step after step — and holds no second copy."""

import pytest
import torch

from stratarl.assembly import roles
from stratarl.config import ConfigError, load_config, validate_config
from stratarl.data.tiny_models import build_tiny_model
from stratarl.data.tokenizer_factory import corpus_from_parquet
from stratarl.observe.run_log import read_metrics
from stratarl.rollout.weight_sync import WeightSyncError
from stratarl.trainer.rl_trainer import RLTrainer
from tests.trainer.test_rl_trainer import RECIPE, small_config

COMPARED = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy")
GAPS = ("rollout_corr/log_ppl_diff_max", "rollout_corr/log_ppl_diff_min")


def _run(task, tmp_path, sharing: str):
    # rollout_is=token logs the gap between the engine's log-probs and the trainer's. The sampled tokens
    # hardly depend on small weight changes (seeded inverse-CDF draws), so that gap is what shows an
    # engine serving stale weights: 7e-6 and 1.4e-5 at steps 2 and 3 for one that served the start
    # weights throughout, against 4.8e-7 for a synced one (measured at lr 1e-3; lr 1e-2 widens it)
    overrides = (
        f"rollout.weight_sharing={sharing}",
        "algorithm.rollout_correction.rollout_is=token",
        "actor.lr=1e-2",
    )
    trainer = RLTrainer(small_config(task, *overrides), tmp_path / sharing)
    trainer.fit()
    train = [r for r in read_metrics(tmp_path / sharing / "metrics.jsonl") if r["phase"] == "train"]
    return trainer.worker.local_worker(), train


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_shared_weights_generate_what_a_synced_copy_generates(family, task, tmp_path):
    if family != "qwen2":
        corpus = corpus_from_parquet([task["train"]])
        model = build_tiny_model(tmp_path / "model", family=family, size="1m", corpus_texts=corpus, seed=0)
        task = {**task, "model": model}
    shared, shared_steps = _run(task, tmp_path, "share")
    copied, copied_steps = _run(task, tmp_path, "copy")

    assert shared.rollout.model is shared.actor.model  # one model in memory
    assert copied.rollout.model is not copied.actor.model
    assert len(shared_steps) == len(copied_steps) == 3
    for a, b in zip(shared_steps, copied_steps, strict=True):
        # Not bit for bit: the shared engine's prefill runs on parameters that require grad, and
        # torch's CPU matmul may take another kernel for those (it does on AVX2, not on AVX-512;
        # docs/rollout.md), so what the engine computes agrees to fp32 rounding (a few 1e-7 in a
        # log-prob). A stale engine is off by 7e-6 or more in the gaps, far outside these bounds.
        for key in COMPARED + GAPS:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), f"step {a['step']}: {key}"
        assert max(abs(a[k]) for k in GAPS) < 2e-6, (
            f"step {a['step']}: the engine's log-probs are not the actor's"
        )
        assert (a["rollout/weights_shared"], b["rollout/weights_shared"]) == (1.0, 0.0)
        assert a["rollout/weight_sync_bytes"] == 0 and b["rollout/weight_sync_bytes"] > 0
    assert shared.weight_version == copied.weight_version == 3
    ours, theirs = shared.actor.model.state_dict(), copied.actor.model.state_dict()
    for key in ours:  # the same training: Adam's updates differ by rounding at most (lr 1e-2)
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-6, msg=key)


def test_auto_shares_only_where_it_is_safe(task):
    assert roles.shares_weights(small_config(task))  # in-process, torch, sync, no LoRA
    for override in ("trainer.mode=one_step_off", "actor.lora.rank=4", "rollout.dtype=bfloat16"):
        assert not roles.shares_weights(small_config(task, override)), override
    assert not roles.shares_weights(small_config(task, "rollout.weight_sharing=copy"))
    # stratarl sft trains in this process, the whole model, between generations: only the engine counts
    assert roles.shares_weights(small_config(task, "trainer.mode=one_step_off"), sft=True)
    assert not roles.shares_weights(small_config(task, "rollout.dtype=bfloat16"), sft=True)


@pytest.mark.parametrize(
    ("override", "blocking_key"),
    [
        ("trainer.mode=async", "trainer.mode"),
        ("actor.lora.rank=8", "actor.lora.rank"),
        ("rollout.dtype=bfloat16", "rollout.dtype"),
        ("rollout.backend=vllm", "rollout.backend"),
        ("cluster.backend=ray", "cluster.backend"),
    ],
)
def test_share_is_refused_where_it_is_not_safe_naming_both_keys(override, blocking_key):
    with pytest.raises(ConfigError) as err:
        validate_config(load_config(RECIPE, ["rollout.weight_sharing=share", override]), check_paths=False)
    [problem] = [p for p in err.value.problems if "rollout.weight_sharing" in p.keys]
    assert set(problem.keys) == {"rollout.weight_sharing", blocking_key}


def test_a_shared_engine_refuses_a_module_it_does_not_serve_and_an_old_version(task, tmp_path):
    trainer = RLTrainer(small_config(task, "rollout.weight_sharing=share"), tmp_path / "run")
    worker = trainer.worker.local_worker()
    engine = worker.rollout
    served = engine.weight_version
    with pytest.raises(WeightSyncError, match="not the module this engine serves"):
        engine.serve_shared_weights(torch.nn.Linear(2, 2), served + 1)
    with pytest.raises(WeightSyncError, match="must increase"):
        engine.serve_shared_weights(worker.actor.model, served)
    report = worker.sync_weights()
    assert (report.version, report.shared, report.num_bytes) == (served + 1, True, 0)
    assert report.num_tensors == len(worker.actor.model.state_dict())
