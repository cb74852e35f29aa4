"""results_to_batch: verl's batch-edge layout (left-padded prompts, right-padded responses, masks,
position ids, rollout log-probs, weight versions) on a hand-written case and its error cases."""

import pytest
import torch

from stratarl.rollout.batch_layout import results_to_batch
from stratarl.rollout.interface import GenerationResult

PAD = 0


def result(rid, prompt, response, log_probs, reason="stop", version=4) -> GenerationResult:
    return GenerationResult(rid, tuple(prompt), tuple(response), tuple(log_probs), reason, version)


RESULTS = [
    result("x", [5, 6], [8, 9, 2], [-0.5, -1.0, -0.25]),
    result("y", [7], [10], [-2.0], reason="length", version=3),
]


def test_hand_written_layout():
    batch = results_to_batch(RESULTS, pad_token_id=PAD)
    assert batch["prompts"].tolist() == [[5, 6], [0, 7]]  # left-padded to P = 2
    assert batch["responses"].tolist() == [[8, 9, 2], [10, 0, 0]]  # right-padded to T = 3
    assert batch["input_ids"].tolist() == [[5, 6, 8, 9, 2], [0, 7, 10, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 0, 0]]
    # cumsum(mask) - 1 clipped at 0: row y: cumsum 0,1,2,2,2 -> -1,0,1,1,1 -> 0,0,1,1,1
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 0, 1, 1, 1]]
    assert batch["response_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["rollout_log_probs"].tolist() == [[-0.5, -1.0, -0.25], [-2.0, 0.0, 0.0]]
    assert batch["weight_version"].tolist() == [4, 3]
    assert batch["finish_reason"] == ["stop", "length"]
    assert batch["request_id"] == ["x", "y"]
    assert batch["replica_id"] == [0, 0]
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"):
        assert batch[key].dtype == torch.int64, key
    assert batch["rollout_log_probs"].dtype == torch.float32
    assert batch["weight_version"].dtype == torch.int64
    assert batch["token_weight_version"].tolist() == [[4, 4, 4], [3, -1, -1]]  # -1 on padding


def test_a_response_continued_across_a_push_carries_each_tokens_version():
    switched = GenerationResult("z", (5,), (8, 9, 2, 11), (-0.5,) * 4, "stop", 3, token_versions=(3, 3, 4, 4))
    batch = results_to_batch([switched, RESULTS[1]], pad_token_id=PAD, max_response_len=5)
    assert batch["token_weight_version"].tolist() == [[3, 3, 4, 4, -1], [3, -1, -1, -1, -1]]
    assert batch["weight_version"].tolist() == [3, 3]  # the oldest: what staleness is measured from
    with pytest.raises(ValueError, match="token versions"):  # weight_version must be the oldest
        GenerationResult("w", (5,), (8, 9), (-0.5, -0.5), "stop", 4, token_versions=(3, 4))
    with pytest.raises(ValueError, match="back in time"):
        GenerationResult("w", (5,), (8, 9), (-0.5, -0.5), "stop", 3, token_versions=(4, 3))


def test_fixed_maxima_pad_further_and_change_no_real_token():
    tight = results_to_batch(RESULTS, pad_token_id=PAD)
    wide = results_to_batch(RESULTS, pad_token_id=PAD, max_prompt_len=4, max_response_len=5)
    assert wide["prompts"].shape == (2, 4) and wide["responses"].shape == (2, 5)
    assert torch.equal(wide["prompts"][:, 2:], tight["prompts"])
    assert torch.equal(wide["responses"][:, :3], tight["responses"])
    assert torch.equal(wide["rollout_log_probs"][:, :3], tight["rollout_log_probs"])
    # real tokens keep their positions: left padding adds leading zeros only
    real = wide["attention_mask"].bool()
    assert torch.equal(wide["position_ids"][real], tight["position_ids"][tight["attention_mask"].bool()])


def test_too_long_raises_naming_the_request():
    with pytest.raises(ValueError, match=r"response longer than max_response_len=2 in requests \['x'\]"):
        results_to_batch(RESULTS, pad_token_id=PAD, max_response_len=2)
    with pytest.raises(ValueError, match=r"prompt longer than max_prompt_len=1 in requests \['x'\]"):
        results_to_batch(RESULTS, pad_token_id=PAD, max_prompt_len=1)
    with pytest.raises(ValueError, match="at least one result"):
        results_to_batch([], pad_token_id=PAD)
