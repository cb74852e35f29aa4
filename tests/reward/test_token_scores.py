"""Score placement: each score on its row's last action token, against a plain loop, all-masked rows."""

import pytest
import torch

from stratarl.reward.token_scores import place_on_last_token


def test_hand_cases():
    scores = torch.tensor([1.0, -2.0, 3.0, 4.0])
    mask = torch.tensor(
        [
            [1, 1, 1, 0],  # last action token at 2
            [1, 0, 1, 1],  # at 3 (holes from observations do not matter)
            [0, 0, 0, 0],  # no action token: no score
            [1, 1, 0, 0],  # at 1
        ]
    )
    out = place_on_last_token(scores, mask)
    expected = torch.zeros(4, 4)
    expected[0, 2], expected[1, 3], expected[3, 1] = 1.0, -2.0, 4.0
    assert torch.equal(out, expected)


def test_matches_a_plain_loop():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(32, generator=gen)
    mask = (torch.rand(32, 9, generator=gen) < 0.5).to(torch.int64)
    out = place_on_last_token(scores, mask)
    for i in range(32):
        expected = torch.zeros(9)
        ones = [t for t in range(9) if mask[i, t] == 1]
        if ones:
            expected[ones[-1]] = scores[i]
        assert torch.equal(out[i], expected)
    assert torch.equal(out.sum(-1), torch.where(mask.any(-1), scores, torch.zeros(())))


def test_dtypes_and_degenerate_shapes():
    out = place_on_last_token(torch.tensor([1, 2]), torch.ones(2, 3, dtype=torch.bool))
    assert out.dtype == torch.float32 and out[:, 2].tolist() == [1.0, 2.0]
    assert place_on_last_token(torch.tensor([5.0]), torch.zeros(1, 0)).shape == (1, 0)
    scores = torch.tensor([2.0], dtype=torch.float64)
    assert place_on_last_token(scores, torch.ones(1, 2)).dtype == torch.float64
    # inputs are not modified
    mask = torch.tensor([[1, 0]])
    place_on_last_token(scores, mask)
    assert mask.tolist() == [[1, 0]]


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match=r"scores \[N\] and response_mask \[N, T\]"):
        place_on_last_token(torch.ones(3), torch.ones(2, 4))
