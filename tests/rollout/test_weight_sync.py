"""Weight sync into the rollout engine: versions bump and are recorded, strict keys, outputs change,
and a load that does not land in the served model is caught."""

import pytest
import torch
from torch import nn

from stratarl.rollout.interface import GenerationRequest, SamplingParams
from stratarl.rollout.weight_sync import (
    WeightSyncError,
    check_state_dict_keys,
    load_in_place,
    parameter_checksum,
)
from tests.rollout.tiny_lm import build_tiny_qwen2

GREEDY_REQUESTS = [
    GenerationRequest("a", [5, 9, 14], SamplingParams(temperature=0.0, max_tokens=8)),
    GenerationRequest("b", [7, 21, 8, 30], SamplingParams(temperature=0.0, max_tokens=8)),
]


def test_load_weights_bumps_version_changes_outputs_and_serves_the_new_model(make_engine):
    served = build_tiny_qwen2(seed=0)
    engine = make_engine(served)
    trained = build_tiny_qwen2(seed=1)  # stands in for the trainer's updated policy
    # norms start at 1 in both inits, so only some tensors differ
    differing = sum(not torch.equal(v, served.state_dict()[k]) for k, v in trained.state_dict().items())
    before = engine.generate(GREEDY_REQUESTS)
    assert engine.weight_version == 0 and {r.weight_version for r in before} == {0}

    report = engine.load_weights(trained.state_dict(), version=1)
    after = engine.generate(GREEDY_REQUESTS)
    assert engine.weight_version == 1 and {r.weight_version for r in after} == {1}
    assert [r.response_ids for r in after] != [r.response_ids for r in before]
    # the served model now answers exactly as the trainer's model does
    reference = make_engine(trained).generate(GREEDY_REQUESTS)
    assert [r.response_ids for r in after] == [r.response_ids for r in reference]
    assert report.version == 1 and report.num_tensors == len(trained.state_dict())
    assert 0 < report.num_changed == differing < report.num_tensors
    assert report.checksum == pytest.approx(parameter_checksum(trained.state_dict()), rel=1e-12)


def test_reloading_identical_weights_reports_nothing_changed(make_engine):
    model = build_tiny_qwen2(seed=0)
    engine = make_engine(model)
    same = {k: v.clone() for k, v in model.state_dict().items()}
    assert engine.load_weights(same, version=3).num_changed == 0
    assert engine.weight_version == 3


def test_version_must_increase(make_engine):
    engine = make_engine(build_tiny_qwen2(seed=0))
    engine.load_weights(build_tiny_qwen2(seed=1).state_dict(), version=2)
    with pytest.raises(WeightSyncError, match="serving 2, asked to load 2"):
        engine.load_weights(build_tiny_qwen2(seed=2).state_dict(), version=2)


def test_missing_unexpected_and_misshapen_keys_raise_naming_them_and_load_nothing(make_engine):
    model = build_tiny_qwen2(seed=0)
    engine = make_engine(model)
    checksum = parameter_checksum(model.state_dict())
    good = build_tiny_qwen2(seed=1).state_dict()

    missing = {k: v for k, v in good.items() if k != "model.norm.weight"}
    with pytest.raises(WeightSyncError, match=r"missing keys \(1\): model\.norm\.weight"):
        engine.load_weights(missing, version=1)
    with pytest.raises(WeightSyncError, match=r"unexpected keys \(1\): model\.extra\.weight"):
        engine.load_weights({**good, "model.extra.weight": torch.zeros(2)}, version=1)
    misshapen = {**good, "model.norm.weight": torch.zeros(31)}
    with pytest.raises(WeightSyncError, match=r"model\.norm\.weight: sent \(31,\), served \(32,\)"):
        engine.load_weights(misshapen, version=1)
    assert engine.weight_version == 0
    assert parameter_checksum(model.state_dict()) == checksum


def test_a_tied_alias_may_be_omitted():
    model = build_tiny_qwen2(seed=0)  # tie_word_embeddings=True: lm_head.weight is embed_tokens.weight
    sent = {k: v for k, v in build_tiny_qwen2(seed=1).state_dict().items() if k != "lm_head.weight"}
    check_state_dict_keys(model, sent)
    load_in_place(model, sent, version=1)
    assert torch.equal(model.lm_head.weight, sent["model.embed_tokens.weight"])


def test_lower_precision_weights_are_cast_and_verified():
    model = build_tiny_qwen2(seed=0)
    sent = {k: v.to(torch.bfloat16) for k, v in build_tiny_qwen2(seed=1).state_dict().items()}
    load_in_place(model, sent, version=1)
    assert model.model.norm.weight.dtype == torch.float32
    assert torch.equal(model.model.norm.weight, sent["model.norm.weight"].float())


class IgnoresLoads(nn.Linear):
    """A layer whose state-dict loading silently does nothing: the bug class the check exists for."""

    def _load_from_state_dict(self, *args, **kwargs):
        pass


def test_a_load_that_does_not_land_is_caught():
    model = nn.Sequential(nn.Linear(3, 3), IgnoresLoads(3, 2))
    sent = {k: torch.ones_like(v) for k, v in model.state_dict().items()}
    with pytest.raises(WeightSyncError, match=r"did not land.*1\.bias, 1\.weight"):
        load_in_place(model, sent, version=1)


def test_checksum_hand_case():
    # Σ (x + |x|) over [1, -2] and [3] = (1 - 2 + 1 + 2) + (3 + 3) = 8
    assert parameter_checksum({"a": torch.tensor([1.0, -2.0]), "b": torch.tensor([3.0])}) == 8.0
