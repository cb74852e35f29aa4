"""The engine interface's value types reject invalid inputs, naming the field."""

import pytest

from stratarl.rollout.interface import GenerationRequest, GenerationResult, SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_invalid_sampling_params_raise(kwargs, field):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**kwargs)


def test_greedy_is_temperature_zero_and_stop_ids_are_ints():
    assert SamplingParams(temperature=0.0).is_greedy
    assert not SamplingParams(temperature=0.1).is_greedy
    assert SamplingParams(stop_token_ids=[4, 5]).stop_token_ids == (4, 5)


def test_stop_strings_become_a_tuple_and_must_be_non_empty():
    assert SamplingParams(stop="</answer>").stop == ("</answer>",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    with pytest.raises(ValueError, match=r"SamplingParams\.stop strings must be non-empty"):
        SamplingParams(stop=("x", ""))


def test_empty_prompt_and_mismatched_result_raise():
    with pytest.raises(ValueError, match="'q' has an empty prompt"):
        GenerationRequest("q", [])
    with pytest.raises(ValueError, match="2 response ids but 1 log-probs"):
        GenerationResult("q", (1,), (2, 3), (-0.1,), "length", 0)
