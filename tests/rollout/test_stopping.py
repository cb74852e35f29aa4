"""StopRule: stop ids before stop strings before length, the bounded tail search, the context cap,
and stop strings without a detokenizer rejected."""

import pytest

from stratarl.rollout.interface import SamplingParams
from stratarl.rollout.stopping import TAIL_EXTRA_TOKENS, StopRule

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def decode(ids):  # token t decodes to one letter
    return "".join(LETTERS[t] for t in ids)


def test_order_of_checks_hand_cases():
    rule = StopRule(SamplingParams(max_tokens=4, stop_token_ids=(25,), stop=("cd",)), [24], decode)
    assert rule.check([0]) is None
    assert rule.check([0, 24]) == ("stop", 24)  # EOS id
    assert rule.check([0, 25]) == ("stop", 25)  # request stop id
    assert rule.check([1, 2, 3]) == ("stop", "cd")  # "bcd" contains "cd"
    assert rule.check([0, 1, 0, 1]) == ("length", None)
    assert rule.check([0, 1, 0, 24]) == ("stop", 24)  # a stop id at the last step is "stop"


def test_stop_string_found_only_within_the_tail_window():
    rule = StopRule(SamplingParams(max_tokens=100, stop=("xyz",)), [], decode)
    assert rule.tail == 3 + TAIL_EXTRA_TOKENS
    assert rule.check([23, 24, 25]) == ("stop", "xyz")
    # a completed string lies in the tail; one that ended long ago is not searched again
    assert rule.check([23, 24, 25] + [0] * rule.tail) is None


def test_context_budget_caps_max_tokens():
    rule = StopRule(SamplingParams(max_tokens=10), [], None, context_budget=3)
    assert rule.check([1, 1]) is None and rule.check([1, 1, 1]) == ("length", None)


def test_stop_strings_need_a_detokenizer():
    with pytest.raises(ValueError, match="need a detokenizer"):
        StopRule(SamplingParams(stop=("x",)), [], None)
