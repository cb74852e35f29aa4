"""Fuzz: random bytes, huge, deeply nested and malformed model outputs thrown at the tool-call parsers and
the scorers, and malformed scorer return values thrown at the reward path — nothing raises, every
score is a finite float, every failure has a reason."""

import math
import random
import sys

import pytest
import torch

from stratarl.agent.tool_parsers import PARSERS
from stratarl.observe.watchdog import WatchdogTimeout
from stratarl.reward import arithmetic, code_exec, gsm8k, tool_arithmetic
from stratarl.reward.batch_scorer import score_batch
from stratarl.reward.process_pool import ScoringPool
from stratarl.reward.score_call import call_scorer, normalize_result
from stratarl.transport.data_proto import DataProto
from tests.reward.pool_scorers import returns_what_it_is_given

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import strategies as st  # noqa: E402

FUZZ = hypothesis.settings(max_examples=60, deadline=None, derandomize=True, database=None)
DEPTH = 50_000  # far past Python's recursion limit


def hostile_texts() -> list[str]:
    """Outputs a broken model writes: huge, deeply nested, binary, half a tag, surrogates."""
    rng = random.Random(0)
    raw = bytes(rng.randrange(256) for _ in range(4096))
    return [
        "",
        "x" * 2_000_000,
        "<tool_call>" * 20_000,
        "<tool_call>" + "[" * DEPTH + "]" * DEPTH + "</tool_call>",
        "<tool_call>" + '{"a":' * DEPTH + "1" + "}" * DEPTH + "</tool_call>",
        '{"name": "calculator", "parameters": ' + "[" * DEPTH + "]" * DEPTH + "}",
        '<tool_call>{"name": "calculator", "arguments": {"expression": "' + "9" * 100_000 + '"}}</tool_call>',
        '<|python_tag|>{"name": 1e999, "parameters": NaN};{"name": null}',
        raw.decode("utf-8", errors="replace"),
        raw.decode("latin-1"),
        raw.decode("utf-8", errors="surrogateescape"),
        "Answer: " + "9" * 10_000,
        "#### " + "1," * 100_000,
        "```python\n" + "(" * DEPTH + "\n```",
    ]


SCORERS = {
    "arithmetic": (arithmetic.compute_score, "7"),
    "tool_arithmetic": (tool_arithmetic.compute_score, "7"),
    "gsm8k": (gsm8k.compute_score, "72"),
}


@pytest.mark.parametrize("text", hostile_texts(), ids=range(len(hostile_texts())))
def test_parsers_and_rule_scorers_survive_hostile_outputs(text):
    for parse in PARSERS.values():
        result = parse(text)
        assert all(isinstance(c.name, str) and isinstance(c.arguments, dict) for c in result.calls)
        assert all(isinstance(e, str) for e in result.errors)
    for source, (scorer, truth) in SCORERS.items():
        outcome = call_scorer(scorer, source, text, truth, None)
        assert math.isfinite(outcome.score) and (outcome.reason is None or outcome.message)


def test_the_code_scorer_survives_hostile_programs():
    cases = {"inputs": ["1\n"], "outputs": ["1\n"]}
    for text in [
        "```python\n" + "(" * DEPTH + "\n```",
        "\x00\udcff",
        "```python\nimport os\nos._exit(0)\n```",
    ]:
        outcome = call_scorer(code_exec.compute_score, "code", text, cases, None)
        assert outcome.score == 0.0 and outcome.reason is None  # a failing program, scored, not a crash


def returns():
    """Return values a buggy scorer produces: nested, huge, non-finite, of any type."""
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**400), max_value=10**400),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=20),
        st.binary(max_size=20),
    )
    nested = st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
        max_leaves=20,
    )
    with_score = st.dictionaries(st.sampled_from(["score", "acc", "x"]), nested, max_size=3)
    return st.one_of(nested, with_score)


def test_any_return_value_is_a_finite_score_or_a_counted_reason():
    @FUZZ
    @hypothesis.given(returns())
    def check(value):
        outcome = normalize_result(value)
        assert math.isfinite(outcome.score)
        assert outcome.reason in (None, "bad_return", "non_finite")
        if outcome.reason is None:
            assert outcome.score == float(value["score"] if isinstance(value, dict) else value)

    check()


def test_malformed_returns_through_the_reward_columns_and_metrics():
    from stratarl.trainer.phases import reward_extra_columns

    values = [
        {"score": 10**400, "acc": 1},
        {"score": float("nan")},
        {"score": 1.0, "acc": 10**400, "deep": [[[[1]]]]},
        {"score": True, "acc": None},
        [1, 2],
        "0.5",
        {"acc": 1.0},
    ]
    result = score_batch(
        ["d"] * len(values), [""] * len(values), values, compute_score=returns_what_it_is_given
    )
    assert torch.isfinite(result.scores).all()
    assert result.sample_failures == [
        "non_finite",
        "non_finite",
        None,
        None,
        "bad_return",
        "bad_return",
        "bad_return",
    ]
    metrics = result.metrics()
    assert all(math.isfinite(v) for v in metrics.values())
    batch = DataProto.from_dict({"x": torch.zeros(len(values))})
    columns = reward_extra_columns(result, batch)
    assert "acc" not in columns and "deep" not in columns  # 10**400 is no float; lists are no numbers


def test_unpicklable_and_huge_returns_from_worker_processes():
    with ScoringPool(returns_what_it_is_given, num_workers=1, timeout_s=10) as pool:
        result = pool.score_batch(["d"] * 3, ["", "", ""], ["unpicklable", "huge", 0.5])
    assert result.sample_failures[0] == "bad_return"  # a lambda cannot travel back
    assert result.scores.tolist()[1:] == [1.0, 0.5]
    assert len(result.extra["blob"][1]) == 2**24  # 16 MB of extras came back intact


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, WatchdogTimeout])
def test_an_interrupt_inside_a_scorer_stops_the_run_not_the_sample(interrupt):
    """SystemExit from a scorer costs its sample; Ctrl-C or the watchdog's interrupt, raised in the
    controller's thread while an in-process scorer runs, must still reach the trainer."""

    def scorer(*_):
        raise interrupt("stop")

    with pytest.raises(interrupt):
        call_scorer(scorer, "src", "text", "1", {})
    outcome = call_scorer(lambda *_: sys.exit(3), "src", "text", "1", {})
    assert (outcome.score, outcome.reason, outcome.message) == (0.0, "SystemExit", "exit code 3")
