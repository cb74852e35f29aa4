"""The batch edge: hand-worked layout, log-probs zeroed off the action mask, over-long sequences named."""

import pytest
import torch

from stratarl.transport.batch_edge import lay_out_batch_edge, padded_length


def test_layout_of_two_rows_by_hand():
    batch = lay_out_batch_edge(
        [[5, 6], [7]], [[8, 9, 10], [11]], pad_token_id=0, prompt_len=3, response_len=3,
        action_mask=[[1, 0, 1], [1]], log_probs=[[-0.5, -9.0, -0.25], [-1.0]],
    )  # fmt: skip
    assert batch["input_ids"].tolist() == [[0, 5, 6, 8, 9, 10], [0, 0, 7, 11, 0, 0]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 0, 1, 2, 3, 4], [0, 0, 0, 1, 1, 1]]
    assert batch["response_mask"].tolist() == [[1, 0, 1], [1, 0, 0]]  # the observation token is 0
    torch.testing.assert_close(
        batch["rollout_log_probs"], torch.tensor([[-0.5, 0.0, -0.25], [-1.0, 0.0, 0.0]])
    )


def test_padded_length_names_the_sequences_that_do_not_fit():
    assert padded_length([[1, 2], [3]], None, "prompt", ["a", "b"]) == 2
    assert padded_length([[1, 2], [3]], 4, "prompt", ["a", "b"]) == 4
    with pytest.raises(ValueError, match=r"max_response_len=1 in requests \['a'\]"):
        padded_length([[1, 2], [3]], 1, "response", ["a", "b"])
