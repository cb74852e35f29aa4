"""Weight sync into the rollout engine: versions bump and are recorded, strict keys, outputs change;
bounded buckets that reassemble exactly, partial updates; and every silent failure caught: a load that
does not land, a lost bucket, a copy of the model updated, a replica keeping its old version, weights
corrupted in transit."""

import pytest
import torch
from torch import nn

from stratarl.rollout.interface import GenerationRequest, SamplingParams
from stratarl.rollout.torch_engine import TorchRolloutEngine
from stratarl.rollout.weight_sync import (
    TensorSlice,
    WeightReceiver,
    WeightSyncError,
    bucket_state_dict,
    check_state_dict_keys,
    load_in_place,
    parameter_checksum,
    push_weights,
    tensor_checksum,
    value_checksum,
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
    assert report.checksum == parameter_checksum(trained.state_dict())


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
    # the fp32 bit patterns as int32: 1.0 = 0x3F800000 = 1065353216, -2.0 = 0xC0000000 = -1073741824,
    # 3.0 = 0x40400000 = 1077936128; their sum 1069547520
    assert parameter_checksum({"a": torch.tensor([1.0, -2.0]), "b": torch.tensor([3.0])}) == 1069547520
    # Σ (x + |x|) over [1, -2] and [3] = (1 - 2 + 1 + 2) + (3 + 3) = 8
    assert value_checksum({"a": torch.tensor([1.0, -2.0]), "b": torch.tensor([3.0])}) == 8.0


def test_checksum_of_row_slices_adds_up_and_one_changed_element_changes_it():
    x = torch.randn(7, 5)
    assert tensor_checksum(x) == sum(tensor_checksum(x[i : i + 2]) for i in range(0, 7, 2))
    bent = x.clone()
    bent[4, 3] = torch.nextafter(bent[4, 3], torch.tensor(float("inf")))  # one ULP on one element
    assert tensor_checksum(bent) != tensor_checksum(x)
    # every dtype a state dict holds, 0-d tensors included; a cast has other bits
    for t in (x.bfloat16(), x.double(), torch.tensor(3.5), torch.arange(4), torch.tensor([True, False])):
        assert tensor_checksum(t) == tensor_checksum(t.clone())
    assert tensor_checksum(x.double()) != tensor_checksum(x)


def test_a_tensor_corrupted_after_it_arrived_is_caught_by_name():
    model = build_tiny_qwen2(seed=0)
    trained = build_tiny_qwen2(seed=1).state_dict()
    receiver = WeightReceiver(model, version=1)
    for bucket in bucket_state_dict(trained, 4096):
        receiver.receive(bucket)
    with torch.no_grad():  # something overwrites one served element before the sync is finished
        weight = model.model.layers[0].mlp.down_proj.weight
        weight[0, 0] = torch.nextafter(weight[0, 0], torch.tensor(float("inf")))
    landed = r"did not land in the served model: model\.layers\.0\.mlp\.down_proj"
    with pytest.raises(WeightSyncError, match=landed):
        receiver.finish()


# --- bucketed sync ---------------------------------------------------------------------------------


def test_buckets_are_bounded_and_reassemble_the_state_dict():
    state = build_tiny_qwen2(seed=1).state_dict()
    bound = 3000  # bytes; the 64x32 fp32 embedding (8 KiB) must be cut into row slices
    buckets = list(bucket_state_dict(state, bound))
    assert all(sum(p.nbytes for p in b) <= bound for b in buckets)
    assert len(buckets) > 1
    pieces: dict[str, list] = {}
    for bucket in buckets:
        for piece in bucket:
            pieces.setdefault(piece.name, []).append(piece)
    assert list(pieces) == list(state)  # every tensor, in order
    for name, parts in pieces.items():
        assert [p.start for p in parts] == sorted(p.start for p in parts)
        assert all(p.total_rows == (state[name].shape[0] if state[name].dim() else 1) for p in parts)
        assert torch.equal(
            torch.cat([p.tensor for p in parts]) if len(parts) > 1 else parts[0].tensor, state[name]
        )


def test_small_buckets_load_the_same_weights_as_one_bucket(make_engine):
    trained = build_tiny_qwen2(seed=1).state_dict()
    small, whole = make_engine(build_tiny_qwen2(seed=0)), make_engine(build_tiny_qwen2(seed=0))
    small.load_weights(trained, version=1, bucket_bytes=512)
    whole.load_weights(trained, version=1, bucket_bytes=2**30)
    for (k, a), b in zip(small.model.state_dict().items(), whole.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_a_partial_update_replaces_only_what_was_sent(make_engine):
    model = build_tiny_qwen2(seed=0)
    engine = make_engine(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    name = "model.layers.0.self_attn.q_proj.weight"
    sent = {name: build_tiny_qwen2(seed=1).state_dict()[name]}
    with pytest.raises(WeightSyncError, match="missing keys"):  # a full update must send everything
        engine.load_weights(sent, version=1)
    report = engine.load_weights(sent, version=1, partial=True)
    assert report.num_tensors == 1 and engine.weight_version == 1
    for k, v in model.state_dict().items():
        assert torch.equal(v, sent[name]) if k == name else torch.equal(v, before[k])


def test_a_lost_bucket_is_detected_and_the_engine_refuses_to_serve_mixed_weights(make_engine):
    engine = make_engine(build_tiny_qwen2(seed=0))
    trained = build_tiny_qwen2(seed=1).state_dict()
    buckets = list(bucket_state_dict(trained, 4096))
    engine.begin_weight_update(1)
    for bucket in buckets[:-1]:  # the last bucket never arrives
        engine.receive_weights(bucket)
    with pytest.raises(WeightSyncError, match="incomplete"):
        engine.finish_weight_update()
    assert engine.weight_version == 0
    with pytest.raises(WeightSyncError, match="served weights are mixed"):
        engine.generate(GREEDY_REQUESTS)
    engine.load_weights(trained, version=1)  # a complete sync recovers
    assert engine.generate(GREEDY_REQUESTS)[0].weight_version == 1


class StateDictOfCopies(nn.Linear):
    """A module whose state_dict hands out copies: loads into it land nowhere (like a stale replica)."""

    def __init__(self):
        super().__init__(3, 2)
        self._register_state_dict_hook(
            lambda module, state, prefix, meta: {k: v.clone() for k, v in state.items()}
        )


def test_weights_copied_into_a_copy_of_the_model_are_caught():
    model = StateDictOfCopies()
    receiver = WeightReceiver(model, version=1)
    receiver.receive(
        [TensorSlice(k, 0, torch.ones_like(v), v.shape[0]) for k, v in model.state_dict().items()]
    )
    with pytest.raises(WeightSyncError, match="did not land in the served model"):
        receiver.finish()


class KeepsOldVersion(TorchRolloutEngine):
    """Fault injection: verifies and acknowledges a sync, but keeps serving the old version."""

    def finish_weight_update(self):
        report = self._receiver.finish()
        self._receiver = None
        return report


class CorruptingLink:
    """Fault injection: the transport adds 1 to the final norm's weights on their way to the replica."""

    def __init__(self, replica):
        self.replica = replica
        self.replica_id = replica.replica_id

    def __getattr__(self, name):
        return getattr(self.replica, name)

    def receive_weights(self, bucket):
        bent = [
            TensorSlice(p.name, p.start, p.tensor + (p.name == "model.norm.weight"), p.total_rows)
            for p in bucket
        ]
        self.replica.receive_weights(bent)


def test_a_replica_that_keeps_its_old_version_or_gets_corrupted_weights_is_caught():
    trained = build_tiny_qwen2(seed=1).state_dict()
    stale = KeepsOldVersion(build_tiny_qwen2(seed=0), eos_token_ids=2, pad_token_id=3, replica_id=7)
    with pytest.raises(WeightSyncError, match=r"replica 7 serves version 0 .* after a sync to version 1"):
        push_weights(trained, [stale], version=1)
    link = CorruptingLink(TorchRolloutEngine(build_tiny_qwen2(seed=0), eos_token_ids=2, pad_token_id=3))
    with pytest.raises(WeightSyncError, match=r"received checksum .* sender sent"):
        push_weights(trained, [link], version=1)
